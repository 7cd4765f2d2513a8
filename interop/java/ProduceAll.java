import java.util.*;
import org.apache.rocketmq.client.producer.*;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/** Java producer checks: sync sends, one batch, and orderly sends by selector.
 *  Usage: ProduceAll namesrv topic N
 *  Prints "sync=A/N batch=B/N batchOffsetsConsecutive=true|false orderly=C/N wrongQueue=W"
 *  and exits 0 only when every send was SEND_OK on the queue asked for. */
public class ProduceAll {
    public static void main(String[] a) throws Exception {
        String ns = a[0], topic = a[1];
        int n = Integer.parseInt(a[2]);
        DefaultMQProducer p = new DefaultMQProducer("GInteropProducer");
        p.setNamesrvAddr(ns);
        p.start();
        int sync = 0;
        for (int i = 0; i < n; i++) {
            if (p.send(new Message(topic, "TagA", ("s" + i).getBytes())).getSendStatus() == SendStatus.SEND_OK) sync++;
        }
        List<Message> batch = new ArrayList<>();
        for (int i = 0; i < n; i++) batch.add(new Message(topic, "TagB", ("b" + i).getBytes()));
        SendResult br = p.send(batch);
        String[] ids = br.getMsgId().split(",");
        boolean batchOk = br.getSendStatus() == SendStatus.SEND_OK && ids.length == n;
        String[] offIds = br.getOffsetMsgId() == null ? new String[0] : br.getOffsetMsgId().split(",");
        int orderly = 0, wrong = 0;
        for (int i = 0; i < n; i++) {
            int key = i % 3;
            SendResult r = p.send(new Message(topic, "TagC", ("o" + i).getBytes()),
                (List<MessageQueue> mqs, Message m, Object arg) -> mqs.get((Integer) arg % mqs.size()), key);
            if (r.getSendStatus() == SendStatus.SEND_OK) orderly++;
            if (r.getMessageQueue().getQueueId() != key % 4) wrong++;
        }
        p.shutdown();
        System.out.println("sync=" + sync + "/" + n + " batch=" + (batchOk ? n : 0) + "/" + n
            + " batchOffsetIds=" + offIds.length + " orderly=" + orderly + "/" + n + " wrongQueue=" + wrong);
        System.exit(sync == n && batchOk && orderly == n && wrong == 0 ? 0 : 1);
    }
}
