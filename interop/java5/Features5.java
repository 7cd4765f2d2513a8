import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.PushConsumer;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;
import org.apache.rocketmq.client.apis.producer.Transaction;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/**
 * RocketMQ's 5.x Java client (rocketmq-client-java) against a gRPC endpoint: each feature
 * prints one line "FEAT name = outcome", with nothing in it that differs from run to run
 * (ids, times and request ids reduced to what they must satisfy), so the lines of idemp's
 * broker can be compared with those of RocketMQ 5.3.3's proxy (interop/features5.expected).
 *
 * Usage: Features5 ENDPOINT SUFFIX [FEATURE,...]. The topics and groups (named with SUFFIX) are created
 * beforehand by interop/run.sh with their message types: TF5_normal, TF5_fifo (FIFO),
 * TF5_delay (DELAY), TF5_tx (TRANSACTION), TF5_push, TF5_pfifo (FIFO); groups GF5_fifo and
 * GF5_pfifo are FIFO groups.
 */
public class Features5 {
    static ClientServiceProvider provider = ClientServiceProvider.loadService();
    static String endpoint;
    static String sfx;

    static void out(String name, Object outcome) {
        System.out.println("FEAT " + name + " = " + outcome);
        System.out.flush();
    }

    static ClientConfiguration config(boolean ssl) {
        return config(ssl, "");
    }

    static ClientConfiguration config(boolean ssl, String namespace) {
        return ClientConfiguration.newBuilder().setEndpoints(endpoint).enableSsl(ssl).setNamespace(namespace)
            .setRequestTimeout(Duration.ofSeconds(5)).build();
    }

    static String t(String name) {
        return name + sfx;
    }

    static String body(MessageView m) {
        ByteBuffer b = m.getBody();
        byte[] a = new byte[b.remaining()];
        b.get(a);
        return new String(a, StandardCharsets.UTF_8);
    }

    /** An error as the client reports it, its request id left out. */
    static String error(Throwable e) {
        while (e.getCause() != null && !(e instanceof org.apache.rocketmq.client.apis.ClientException)) {
            e = e.getCause();
        }
        String text = String.valueOf(e.getMessage()).replaceAll("request-id=[^,\\]]*", "request-id=ID");
        return e.getClass().getSimpleName() + ": " + text.replaceAll("\\s+", " ");
    }

    static Producer producer(String... topics) throws Exception {
        return provider.newProducerBuilder().setClientConfiguration(config(false)).setTopics(topics).build();
    }

    static SimpleConsumer simple(String group, String topic, FilterExpression filter) throws Exception {
        return provider.newSimpleConsumerBuilder().setClientConfiguration(config(false))
            .setConsumerGroup(group).setAwaitDuration(Duration.ofSeconds(5))
            .setSubscriptionExpressions(Collections.singletonMap(topic, filter)).build();
    }

    /** Receive (and ack) until n messages came or the time is up. */
    static List<MessageView> receiveAll(SimpleConsumer c, int n, long withinMs, boolean ack) throws Exception {
        List<MessageView> got = new ArrayList<>();
        long end = System.currentTimeMillis() + withinMs;
        while (got.size() < n && System.currentTimeMillis() < end) {
            for (MessageView m : c.receive(16, Duration.ofSeconds(15))) {
                got.add(m);
                if (ack) {
                    c.ack(m);
                }
            }
        }
        return got;
    }

    static Message msg(String topic, String body, String tag) {
        org.apache.rocketmq.client.apis.message.MessageBuilder b = provider.newMessageBuilder()
            .setTopic(topic).setBody(body.getBytes(StandardCharsets.UTF_8));
        if (tag != null) {
            b.setTag(tag);
        }
        return b.build();
    }

    public static void main(String[] args) throws Exception {
        endpoint = args[0];
        sfx = args[1];
        // a third argument: only these features (comma-separated names)
        java.util.Set<String> only = new java.util.HashSet<>(
            java.util.Arrays.asList(args.length > 2 ? args[2].split(",") : new String[0]));
        for (String f : new String[] {"simple", "filter", "fifo", "delay", "recall", "tx", "push",
            "pushfifo", "invisible", "refused", "ssl", "namespace"}) {
            if (!only.isEmpty() && !only.contains(f)) {
                continue;
            }
            try {
                Features5.class.getDeclaredMethod(f).invoke(null);
            } catch (java.lang.reflect.InvocationTargetException e) {
                out(f, "FAILED " + error(e.getCause()));
            }
        }
        System.exit(0);
    }

    // send with keys, a tag and properties; receive them with a SimpleConsumer and ack them
    static void simple() throws Exception {
        String topic = t("TF5_normal");
        List<String> ids = new ArrayList<>();
        try (Producer p = producer(topic)) {
            for (int i = 0; i < 3; i++) {
                Message m = provider.newMessageBuilder().setTopic(topic).setTag("TagS")
                    .setKeys("k" + i, "kk" + i).addProperty("p", "v" + i).addProperty("u", "välue=1;x")
                    .setBody(("s" + i).getBytes(StandardCharsets.UTF_8)).build();
                SendReceipt r = p.send(m);
                ids.add(r.getMessageId().toString());
            }
        }
        out("send", "ids=" + ids.size() + " version=" + ids.get(0).substring(0, 2) + " len=" + ids.get(0).length()
            + " distinct=" + (new java.util.HashSet<>(ids).size() == 3));
        long before = System.currentTimeMillis();
        try (SimpleConsumer c = simple(t("GF5_simple"), topic, FilterExpression.SUB_ALL)) {
            List<MessageView> got = receiveAll(c, 3, 40000, true);
            List<String> seen = new ArrayList<>();
            for (MessageView m : got) {
                List<String> keys = new ArrayList<>(m.getKeys());
                Collections.sort(keys);
                seen.add(body(m) + " topic=" + m.getTopic() + " tag=" + m.getTag().orElse("-") + " keys=" + keys
                    + " props=" + new TreeMap<>(m.getProperties()) + " group=" + m.getMessageGroup().orElse("-")
                    + " delay=" + m.getDeliveryTimestamp().isPresent() + " attempt=" + m.getDeliveryAttempt()
                    + " idKnown=" + ids.contains(m.getMessageId().toString())
                    + " bornHost=" + !m.getBornHost().isEmpty()
                    + " bornRecent=" + (m.getBornTimestamp() > before - 60000 && m.getBornTimestamp() <= System.currentTimeMillis()));
            }
            Collections.sort(seen);
            out("simple", seen);
            out("simpleagain", c.receive(16, Duration.ofSeconds(15)).size());
        }
    }

    // tag filters: only the messages whose tag is listed
    static void filter() throws Exception {
        String topic = t("TF5_normal");
        try (Producer p = producer(topic)) {
            for (String tag : new String[] {"TagA", "TagB", "TagC", "TagA"}) {
                p.send(msg(topic, "f-" + tag, tag));
            }
        }
        try (SimpleConsumer c = simple(t("GF5_filter"), topic, new FilterExpression("TagA || TagC", FilterExpressionType.TAG))) {
            List<String> seen = new ArrayList<>();
            for (MessageView m : receiveAll(c, 3, 40000, true)) {
                seen.add(body(m));
            }
            Collections.sort(seen);
            out("tagfilter", seen);
        }
    }

    // FIFO: two message groups, each received in send order, one group at a time per receive
    static void fifo() throws Exception {
        String topic = t("TF5_fifo");
        try (Producer p = producer(topic)) {
            for (int i = 0; i < 4; i++) {
                for (String g : new String[] {"ga", "gb"}) {
                    p.send(provider.newMessageBuilder().setTopic(topic).setMessageGroup(g)
                        .setBody((g + i).getBytes(StandardCharsets.UTF_8)).build());
                }
            }
        }
        Map<String, List<String>> order = new TreeMap<>();
        boolean oneGroupPerReceive = true;
        try (SimpleConsumer c = simple(t("GF5_fifo"), topic, FilterExpression.SUB_ALL)) {
            long end = System.currentTimeMillis() + 60000;
            int n = 0;
            while (n < 8 && System.currentTimeMillis() < end) {
                List<MessageView> batch = c.receive(16, Duration.ofSeconds(15));
                java.util.Set<String> groups = new java.util.HashSet<>();
                for (MessageView m : batch) {
                    String g = m.getMessageGroup().orElse("-");
                    groups.add(g);
                    order.computeIfAbsent(g, k -> new ArrayList<>()).add(body(m));
                    c.ack(m);
                    n++;
                }
                oneGroupPerReceive &= groups.size() <= 1;
            }
        }
        out("fifo", order + " oneGroupPerReceive=" + oneGroupPerReceive);
    }

    // DELAY: delivered at its delivery timestamp, which the consumer sees
    static void delay() throws Exception {
        String topic = t("TF5_delay");
        long at = System.currentTimeMillis() + 3000;
        try (Producer p = producer(topic)) {
            p.send(provider.newMessageBuilder().setTopic(topic).setDeliveryTimestamp(at)
                .setBody("later".getBytes(StandardCharsets.UTF_8)).build());
        }
        try (SimpleConsumer c = simple(t("GF5_delay"), topic, FilterExpression.SUB_ALL)) {
            List<MessageView> got = receiveAll(c, 1, 30000, true);
            long now = System.currentTimeMillis();
            String seen = got.isEmpty() ? "none" : body(got.get(0)) + " deliveryTimestamp="
                + got.get(0).getDeliveryTimestamp().map(d -> d == at ? "as sent" : d.toString()).orElse("-")
                + " after>=2.9s:" + (now >= at - 100) + " <10s:" + (now < at + 7000);
            out("delay", seen);
        }
        // a delivery timestamp on a NORMAL topic's message
        try (Producer p = producer(t("TF5_normal"))) {
            p.send(provider.newMessageBuilder().setTopic(t("TF5_normal")).setDeliveryTimestamp(System.currentTimeMillis() + 2000)
                .setBody("x".getBytes(StandardCharsets.UTF_8)).build());
            out("delayonnormal", "SEND_OK");
        } catch (Exception e) {
            out("delayonnormal", error(e));
        }
    }

    // a delay message recalled before its time is never delivered
    static void recall() throws Exception {
        String topic = t("TF5_delay");
        long at = System.currentTimeMillis() + 4000;
        String handle;
        try (Producer p = producer(topic)) {
            SendReceipt r = p.send(provider.newMessageBuilder().setTopic(topic).setDeliveryTimestamp(at)
                .setBody("recalled".getBytes(StandardCharsets.UTF_8)).build());
            handle = r.getRecallHandle();
            String recalled;
            try {
                recalled = p.recallMessage(topic, handle).getMessageId().toString();
            } catch (Exception e) {
                // refused unless the broker's recallMessageEnable is true (false by default)
                out("recall", "refused: " + error(e));
                return;
            }
            out("recall", "handle=" + (handle != null && !handle.isEmpty()) + " sameId=" + recalled.equals(r.getMessageId().toString()));
            try {
                p.recallMessage(topic, "not-a-handle");
                out("recallbad", "accepted");
            } catch (Exception e) {
                out("recallbad", error(e));
            }
        }
        try (SimpleConsumer c = simple(t("GF5_recall"), topic, FilterExpression.SUB_ALL)) {
            List<String> seen = new ArrayList<>();
            for (MessageView m : receiveAll(c, 1, 10000, true)) {
                seen.add(body(m));
            }
            out("recalled", "delivered=" + seen);
        }
    }

    // transactions: commit, rollback, and one left open that the checker commits
    static void tx() throws Exception {
        String topic = t("TF5_tx");
        List<String> checks = new CopyOnWriteArrayList<>();
        try (Producer p = provider.newProducerBuilder().setClientConfiguration(config(false)).setTopics(topic)
            .setTransactionChecker(m -> {
                checks.add(body(m));
                return TransactionResolution.COMMIT;
            }).build()) {
            for (String what : new String[] {"commit", "rollback", "unknown"}) {
                Transaction tx = p.beginTransaction();
                p.send(msg(topic, what, "TagT"), tx);
                if (what.equals("commit")) {
                    tx.commit();
                } else if (what.equals("rollback")) {
                    tx.rollback();
                }
            }
            try (SimpleConsumer c = simple(t("GF5_tx"), topic, FilterExpression.SUB_ALL)) {
                List<String> seen = new ArrayList<>();
                for (MessageView m : receiveAll(c, 2, 90000, true)) {
                    seen.add(body(m));
                }
                Collections.sort(seen);
                out("tx", "got=" + seen + " checks=" + new java.util.TreeSet<>(checks));
            }
        }
    }

    // a push consumer: a FAILURE comes back with its delivery attempt raised
    static void push() throws Exception {
        String topic = t("TF5_push");
        Map<String, List<Integer>> attempts = new ConcurrentHashMap<>();
        PushConsumer c = provider.newPushConsumerBuilder().setClientConfiguration(config(false))
            .setConsumerGroup(t("GF5_push")).setSubscriptionExpressions(Collections.singletonMap(topic, FilterExpression.SUB_ALL))
            .setMessageListener(m -> {
                List<Integer> a = attempts.computeIfAbsent(body(m), k -> new CopyOnWriteArrayList<>());
                a.add(m.getDeliveryAttempt());
                return body(m).equals("p2") && a.size() == 1 ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
            }).build();
        try (Producer p = producer(topic)) {
            for (int i = 0; i < 5; i++) {
                p.send(msg(topic, "p" + i, null));
            }
            long end = System.currentTimeMillis() + 90000;
            while (System.currentTimeMillis() < end && !(attempts.size() == 5 && attempts.get("p2").size() == 2)) {
                Thread.sleep(200);
            }
            Thread.sleep(1000); // nothing more may come
            out("push", new TreeMap<>(attempts));
        } finally {
            c.close();
        }
    }

    // a FIFO push consumer: each group in order, a failed message retried before the rest of its group
    static void pushfifo() throws Exception {
        String topic = t("TF5_pfifo");
        Map<String, List<String>> seen = new ConcurrentHashMap<>();
        java.util.Set<String> failed = ConcurrentHashMap.newKeySet();
        PushConsumer c = provider.newPushConsumerBuilder().setClientConfiguration(config(false))
            .setConsumerGroup(t("GF5_pfifo")).setSubscriptionExpressions(Collections.singletonMap(topic, FilterExpression.SUB_ALL))
            .setMessageListener(m -> {
                String b = body(m);
                seen.computeIfAbsent(m.getMessageGroup().orElse("-"), k -> new CopyOnWriteArrayList<>())
                    .add(b + "@" + m.getDeliveryAttempt());
                return b.equals("ga1") && failed.add(b) ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
            }).build();
        try (Producer p = producer(topic)) {
            for (int i = 0; i < 3; i++) {
                for (String g : new String[] {"ga", "gb"}) {
                    p.send(provider.newMessageBuilder().setTopic(topic).setMessageGroup(g)
                        .setBody((g + i).getBytes(StandardCharsets.UTF_8)).build());
                }
            }
            long end = System.currentTimeMillis() + 60000;
            while (System.currentTimeMillis() < end
                && !(seen.getOrDefault("ga", Collections.emptyList()).size() == 4 && seen.getOrDefault("gb", Collections.emptyList()).size() == 3)) {
                Thread.sleep(200);
            }
            Thread.sleep(1000);
            out("pushfifo", new TreeMap<>(seen));
        } finally {
            c.close();
        }
    }

    // an unacked message comes back after its invisible time, its delivery attempt raised;
    // changing the invisible time counts as a delivery
    static void invisible() throws Exception {
        String topic = t("TF5_normal");
        try (Producer p = producer(topic)) {
            p.send(msg(topic, "inv", "TagI"));
        }
        try (SimpleConsumer c = simple(t("GF5_invisible"), topic, new FilterExpression("TagI", FilterExpressionType.TAG))) {
            List<MessageView> first = receiveAll(c, 1, 30000, false);
            MessageView m = first.get(0);
            c.changeInvisibleDuration(m, Duration.ofSeconds(10));
            long t0 = System.currentTimeMillis();
            List<MessageView> again = new ArrayList<>();
            while (again.isEmpty() && System.currentTimeMillis() < t0 + 40000) {
                again = c.receive(16, Duration.ofSeconds(10));
            }
            long dt = System.currentTimeMillis() - t0;
            String outcome = "first=" + m.getDeliveryAttempt() + " again=" + (again.isEmpty() ? "none"
                : again.get(0).getDeliveryAttempt() + " after>=9s:" + (dt >= 9000) + " <30s:" + (dt < 30000));
            try {
                c.ack(m);
                outcome += " staleAck=ok";
            } catch (Exception e) {
                outcome += " staleAck=" + error(e);
            }
            if (!again.isEmpty()) {
                c.ack(again.get(0));
            }
            out("invisible", outcome);
        }
    }

    /** One send's outcome: SEND_OK, or the error as the client reports it. */
    static void sendOutcome(String name, Producer p, Message m) {
        try {
            p.send(m);
            out(name, "SEND_OK");
        } catch (Exception e) {
            out(name, error(e));
        }
    }

    // what the broker refuses, and how the client reports it
    static void refused() throws Exception {
        try (Producer p = producer(t("TF5_normal"))) {
            sendOutcome("nosuchtopic", p, msg(t("TF5_nosuch"), "x", null));
            sendOutcome("fifoonnormal", p, provider.newMessageBuilder().setTopic(t("TF5_normal")).setMessageGroup("g")
                .setBody("x".getBytes(StandardCharsets.UTF_8)).build());
            sendOutcome("normalonfifo", p, msg(t("TF5_fifo"), "x", null));
            sendOutcome("bigbody", p, msg(t("TF5_normal"), new String(new char[4 * 1024 * 1024 + 1]).replace('\0', 'b'), null));
        }
        try (SimpleConsumer c = simple(t("GF5_refused"), t("TF5_normal"), FilterExpression.SUB_ALL)) {
            try {
                out("invisible5s", c.receive(1, Duration.ofSeconds(5)).size());
            } catch (Exception e) {
                out("invisible5s", error(e));
            }
            try {
                c.receive(33, Duration.ofSeconds(15));
                out("receive33", "accepted");
            } catch (Exception e) {
                out("receive33", error(e));
            }
        }
        try (SimpleConsumer c = simple(t("GF5_refused2"), t("TF5_nosuch"), FilterExpression.SUB_ALL)) {
            out("receivenosuch", c.receive(1, Duration.ofSeconds(15)).size());
        } catch (Exception e) {
            out("receivenosuch", error(e));
        }
    }

    // TLS, the Java client's default
    static void ssl() throws Exception {
        try (Producer p = provider.newProducerBuilder().setClientConfiguration(ClientConfiguration.newBuilder()
            .setEndpoints(endpoint).setRequestTimeout(Duration.ofSeconds(5)).build()).setTopics(t("TF5_normal")).build()) {
            p.send(msg(t("TF5_normal"), "tls", "TagTls"));
            out("ssl", "SEND_OK");
        } catch (Exception e) {
            out("ssl", error(e));
        }
    }

    // a namespace in the client's configuration: where its messages go, and who sees them
    static void namespace() throws Exception {
        String topic = t("TF5_normal");
        try (Producer p = provider.newProducerBuilder().setClientConfiguration(config(false, "ns1")).setTopics(topic).build()) {
            p.send(msg(topic, "in-ns1", "TagNs"));
            out("namespacesend", "SEND_OK");
        } catch (Exception e) {
            out("namespacesend", error(e));
        }
        FilterExpression tag = new FilterExpression("TagNs", FilterExpressionType.TAG);
        try (SimpleConsumer c = provider.newSimpleConsumerBuilder().setClientConfiguration(config(false, "ns1"))
            .setConsumerGroup(t("GF5_ns")).setAwaitDuration(Duration.ofSeconds(5))
            .setSubscriptionExpressions(Collections.singletonMap(topic, tag)).build()) {
            List<String> seen = new ArrayList<>();
            for (MessageView m : receiveAll(c, 1, 20000, true)) {
                seen.add(body(m) + " topic=" + m.getTopic());
            }
            out("namespacereceive", seen);
        } catch (Exception e) {
            out("namespacereceive", error(e));
        }
        try (SimpleConsumer c = simple(t("GF5_nsplain"), topic, tag)) {
            List<String> seen = new ArrayList<>();
            for (MessageView m : receiveAll(c, 1, 20000, true)) {
                seen.add(body(m) + " topic=" + m.getTopic());
            }
            out("namespaceplain", seen);
        }
    }
}
