import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.*;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;

/** Sends N messages, then counts what a push consumer (concurrent or orderly) receives.
 *  Usage: PushCount namesrv topic group N concurrent|orderly timeoutSeconds
 *  Prints "received=K distinct=D expected=N outOfOrder=O" (O: orderly, per queue) and exits 0 only when every message came once. */
public class PushCount {
    public static void main(String[] a) throws Exception {
        String ns = a[0], topic = a[1], group = a[2];
        int n = Integer.parseInt(a[3]);
        boolean orderly = a[4].equals("orderly");
        long timeoutMs = Long.parseLong(a[5]) * 1000;
        DefaultMQProducer p = new DefaultMQProducer(group + "_P");
        p.setNamesrvAddr(ns);
        p.start();
        for (int i = 0; i < n; i++) {
            p.send(new Message(topic, "TagA", ("m" + i).getBytes()));
        }
        p.shutdown();
        Set<String> seen = ConcurrentHashMap.newKeySet();
        AtomicInteger count = new AtomicInteger();
        AtomicInteger outOfOrder = new AtomicInteger();
        Map<Integer, Integer> lastPerQueue = new ConcurrentHashMap<>();
        CountDownLatch done = new CountDownLatch(n);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(ns);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        // the latch counts a message inside the listener, before its consume result is applied:
        // without this wait, shutdown persists the offsets while the last batch is still in flight
        // (its offset not yet advanced), and consumerProgress afterwards shows it as not consumed
        c.setAwaitTerminationMillisWhenShutdown(10_000);
        if (orderly) {
            c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    int i = Integer.parseInt(new String(m.getBody()).substring(1));
                    Integer last = lastPerQueue.put(m.getQueueId(), i);
                    if (last != null && last >= i) outOfOrder.incrementAndGet();
                    count.incrementAndGet(); if (seen.add(new String(m.getBody()))) done.countDown(); }
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) { count.incrementAndGet(); if (seen.add(new String(m.getBody()))) done.countDown(); }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        c.start();
        boolean all = done.await(timeoutMs, TimeUnit.MILLISECONDS);
        c.shutdown();
        System.out.println("mode=" + a[4] + " received=" + count.get() + " distinct=" + seen.size() + " expected=" + n
            + " outOfOrder=" + outOfOrder.get() + " queues=" + lastPerQueue.size());
        System.exit(all && count.get() == n && outOfOrder.get() == 0 ? 0 : 1);
    }
}
