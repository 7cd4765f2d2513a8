import java.util.*;
import java.util.concurrent.atomic.*;
import org.apache.rocketmq.client.consumer.*;
import org.apache.rocketmq.client.consumer.listener.*;
import org.apache.rocketmq.client.producer.*;
import org.apache.rocketmq.common.message.*;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
/** SQL92 subscriptions of the Java push consumer (the broker with enablePropertyFilter=true): what each
 *  expression delivers of seven messages. Usage: SqlFilter namesrv runId */
public class SqlFilter {
    public static void main(String[] a) throws Exception {
        String ns = a[0], run = a[1], topic = "TSQL" + run;
        DefaultMQProducer p = new DefaultMQProducer("PSQL" + run); p.setNamesrvAddr(ns); p.start();
        String[][] msgs = {{"3", "A"}, {"10", "B"}, {"7", "A"}, {"x", "A"}, {"10.5", "A"}, {null, "A"}, {"8", "A"}};
        for (String[] m : msgs) { Message x = new Message(topic, m[1], ("a=" + m[0] + "/" + m[1]).getBytes()); if (m[0] != null) x.putUserProperty("a", m[0]); p.send(x); }
        String[] sqls = {"a > 5", "a IS NULL OR a = 'x'", "a BETWEEN 6 AND 10 AND TAGS = 'A'", "a > 5.0", "NOT (a > 5)", "a IN ('x', '3')", "a >", "TAGS = 'B' OR a < 4"};
        int i = 0;
        for (String sql : sqls) {
            i++;
            DefaultMQPushConsumer c = new DefaultMQPushConsumer("CSQL" + run + "_" + i); c.setNamesrvAddr(ns); c.setInstanceName("CSQL" + run + i);
            c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            List<String> got = Collections.synchronizedList(new ArrayList<>());
            try {
                c.subscribe(topic, MessageSelector.bySql(sql));
                c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
                c.start();
                Thread.sleep(6000);
                List<String> g = new ArrayList<>(got); Collections.sort(g);
                System.out.println("SQL [" + sql + "] -> " + g);
            } catch (Throwable t) { System.out.println("SQL [" + sql + "] -> EXC " + t.getMessage().split("DESC")[0].trim()); }
            c.shutdown();
        }
        p.shutdown(); System.exit(0);
    }
}
