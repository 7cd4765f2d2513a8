import java.io.InputStream;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.*;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;

/** A producer and a push consumer kept online, for the mqadmin commands that ask the broker
 *  about live clients (producer, producerConnection, consumerConnection, consumerStatus).
 *  Usage: Hold namesrv topic group producerGroup n
 *  Sends n messages, prints "HOLD ready" once the consumer has them, then stays online until
 *  its standard input closes. */
public class Hold {
    public static void main(String[] a) throws Exception {
        String ns = a[0], topic = a[1], group = a[2], producerGroup = a[3];
        int n = Integer.parseInt(a[4]);
        CountDownLatch got = new CountDownLatch(n);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(ns);
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            msgs.forEach(m -> got.countDown());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        DefaultMQProducer p = new DefaultMQProducer(producerGroup);
        p.setNamesrvAddr(ns);
        p.start();
        for (int i = 0; i < n; i++) {
            p.send(new Message(topic, "TagH", ("h" + i).getBytes()));
        }
        // the producer's periodic heartbeat first runs a second after its start, and finds the
        // broker only if a send has looked its route up by then: register it now, so that
        // the broker lists the group whatever the timing
        p.getDefaultMQProducerImpl().getmQClientFactory().sendHeartbeatToAllBrokerWithLock();
        c.start();
        if (!got.await(60, TimeUnit.SECONDS)) {
            System.out.println("HOLD failed: " + got.getCount() + " of " + n + " not consumed");
            System.exit(1);
        }
        System.out.println("HOLD ready");
        System.out.flush();
        InputStream in = System.in;
        while (in.read() >= 0) { }
        c.shutdown();
        p.shutdown();
    }
}
