import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.rocketmq.client.consumer.*;
import org.apache.rocketmq.client.consumer.listener.*;
import org.apache.rocketmq.client.producer.*;
import org.apache.rocketmq.client.utils.MessageUtil;
import org.apache.rocketmq.client.QueryResult;
import org.apache.rocketmq.common.message.*;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;

/** The Java client's features beyond plain push and send, one line each ("FEAT name = outcome"),
 *  normalised (no addresses, timings or queue picks) so that a run against idemp's broker can be
 *  compared with the outcomes seen against RocketMQ 4.9.7 (interop/features.expected).
 *  Usage: Features namesrv [runId [feature,feature...]] */
public class Features {
    static String ns, run;
    static void out(String k, Object v) { System.out.println("FEAT " + k + " = " + v); System.out.flush(); }
    static DefaultMQProducer producer(String g) throws Exception {
        DefaultMQProducer p = new DefaultMQProducer(g + run); p.setNamesrvAddr(ns); p.setInstanceName(g + run); p.start(); return p;
    }
    static DefaultMQPushConsumer push(String g, String topic, String sub) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(g + run); c.setNamesrvAddr(ns); c.setInstanceName(g + run);
        c.subscribe(topic, sub); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET); return c;
    }
    static void waitFor(java.util.function.BooleanSupplier f, long ms) throws Exception {
        long end = System.currentTimeMillis() + ms; while (!f.getAsBoolean() && System.currentTimeMillis() < end) Thread.sleep(50);
    }
    static String r0(DefaultMQProducer p, String topic) throws Exception { return p.send(new Message(topic, "w", "w".getBytes()), new MessageQueue(topic, "broker-a", 1)).getMessageQueue().getBrokerName(); }
    static String err(Throwable t) { String m = t.getClass().getSimpleName() + ": " + t.getMessage(); return m.split("\n")[0].replaceAll("\\d{8,}", "N").replaceAll("cost \\[\\d+\\]ms", "cost [N]ms"); }

    public static void main(String[] a) throws Exception {
        ns = a[0]; run = a.length > 1 ? a[1] : Long.toString(System.currentTimeMillis() % 100000);
        String only = a.length > 2 ? a[2] : "";
        DefaultMQProducer p = producer("PF");
        String[] feats = {"async", "oneway", "tags", "sql", "delay", "props", "compress", "pull", "lite", "liteassign", "broadcast", "retry", "query", "badqueue", "reply", "trace", "tx", "dlq", "batchprops", "delaymax", "readonly", "orderlysuspend", "createtopic", "nosuch", "pull64", "fromts", "namespace", "delaynext", "dlqdirect", "bigprops", "emptybody", "subtrace", "fromlast", "litecommit", "litetime", "orderlybc", "vip", "tls", "replyns", "requestasync", "longpoll", "suspend", "storedoffset", "pullsql", "orderly2", "mixed"};
        for (String f : feats) {
            if (!only.isEmpty() && !Arrays.asList(only.split(",")).contains(f)) continue;
            try { feature(f, p); } catch (Throwable t) { out(f, "EXC " + err(t)); }
        }
        p.shutdown();
        System.exit(0);
    }

    static void feature(String f, DefaultMQProducer p) throws Exception {
        String topic = "TF_" + f + run;
        switch (f) {
        case "async": {
            CountDownLatch l = new CountDownLatch(5); AtomicInteger ok = new AtomicInteger();
            for (int i = 0; i < 5; i++) p.send(new Message(topic, "a", ("x" + i).getBytes()), new SendCallback() {
                public void onSuccess(SendResult r) { if (r.getSendStatus() == SendStatus.SEND_OK) ok.incrementAndGet(); l.countDown(); }
                public void onException(Throwable e) { out("async.err", err(e)); l.countDown(); } });
            l.await(10, TimeUnit.SECONDS); out(f, ok.get() + "/5"); break; }
        case "oneway": {
            p.send(new Message(topic, "a", "warm".getBytes()));
            for (int i = 0; i < 5; i++) p.sendOneway(new Message(topic, "a", ("x" + i).getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); AtomicInteger n = new AtomicInteger();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { n.addAndGet(ms.size()); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> n.get() >= 6, 20000); Thread.sleep(500); c.shutdown(); out(f, n.get()); break; }
        case "tags": {
            for (String t : new String[]{"TagA", "TagB", "TagC", "TagA", "TagB", "TagC"}) p.send(new Message(topic, t, t.getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "TagA || TagC"); List<String> got = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(m.getTags()); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 4, 20000); Thread.sleep(1000); c.shutdown(); List<String> s = new ArrayList<>(got); Collections.sort(s); out(f, s); break; }
        case "sql": {
            p.send(new Message(topic, "a", "x".getBytes()));
            DefaultMQPushConsumer c = new DefaultMQPushConsumer("CF_sql" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_sql" + run);
            c.subscribe(topic, MessageSelector.bySql("a > 5"));
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> ConsumeConcurrentlyStatus.CONSUME_SUCCESS);
            try { c.start(); out(f, "started"); } catch (Throwable t) { out(f, "start failed: " + err(t)); }
            c.shutdown(); break; }
        case "delay": {
            Message m = new Message(topic, "a", "d".getBytes()); m.setDelayTimeLevel(2);
            long sent = System.currentTimeMillis(); SendResult r = p.send(m);
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); AtomicLong at = new AtomicLong(); AtomicReference<String> info = new AtomicReference<>();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { long now = System.currentTimeMillis();
                MessageExt x = ms.get(0); info.set("topic=" + x.getTopic() + " REAL_TOPIC=" + x.getProperty("REAL_TOPIC") + " DELAY=" + x.getProperty("DELAY") + " sameQueue=" + (x.getQueueId() == r.getMessageQueue().getQueueId()) + " msgIdEqual=" + x.getMsgId().equals(r.getMsgId()));
                at.set(now); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> at.get() > 0, 30000); c.shutdown();
            long d = at.get() - sent; out(f, "delivered after>=4.5s:" + (d >= 4500) + " <9s:" + (d < 9000) + " " + info.get()); break; }
        case "props": {
            Message m = new Message(topic, "TagP", "k1 k2", "body".getBytes()); m.putUserProperty("uk", "välue=1;x"); m.putUserProperty("n", "2");
            SendResult r = p.send(m);
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); AtomicReference<MessageExt> got = new AtomicReference<>();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { got.set(ms.get(0)); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.get() != null, 20000); c.shutdown();
            MessageExt x = got.get(); TreeMap<String, String> props = new TreeMap<>(x.getProperties());
            props.remove("UNIQ_KEY"); props.remove("MIN_OFFSET"); props.remove("MAX_OFFSET"); props.remove("CONSUME_START_TIME");
            out(f, props + " keys=" + x.getKeys() + " tags=" + x.getTags() + " offsetMsgIdEq=" + r.getOffsetMsgId().equals(((MessageClientExt) x).getOffsetMsgId())
                + " sysFlag=" + x.getSysFlag() + " reconsume=" + x.getReconsumeTimes() + " flag=" + x.getFlag() + " bodyCRC=" + x.getBodyCRC() + " storeSize=" + x.getStoreSize()
                + " bornHostOk=" + (x.getBornHost() != null) + " prepOff=" + x.getPreparedTransactionOffset());
            break; }
        case "compress": {
            StringBuilder sb = new StringBuilder(); for (int i = 0; i < 3000; i++) sb.append("hello ").append(i % 10); String body = sb.toString();
            p.send(new Message(topic, "a", body.getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); AtomicReference<MessageExt> got = new AtomicReference<>();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { got.set(ms.get(0)); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.get() != null, 20000); c.shutdown();
            out(f, "equal=" + body.equals(new String(got.get().getBody())) + " sysFlag=" + got.get().getSysFlag()); break; }
        case "pull": {
            MessageQueue mq = null;
            for (int i = 0; i < 6; i++) { SendResult r = p.send(new Message(topic, i % 2 == 0 ? "even" : "odd", ("x" + i).getBytes())); mq = r.getMessageQueue(); }
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_pull" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_pull" + run); c.start();
            Set<MessageQueue> mqs = c.fetchSubscribeMessageQueues(topic);
            StringBuilder sb = new StringBuilder("queues=" + mqs.size());
            int total = 0, even = 0;
            for (MessageQueue q : new TreeSet<>(mqs)) {
                PullResult r = c.pull(q, "*", 0, 32); if (r.getMsgFoundList() != null) total += r.getMsgFoundList().size();
                PullResult e = c.pull(q, "even", 0, 32); if (e.getMsgFoundList() != null) even += e.getMsgFoundList().size();
                sb.append(" q").append(q.getQueueId()).append(":").append(r.getPullStatus()).append("/").append(r.getNextBeginOffset()).append("/").append(r.getMinOffset()).append("/").append(r.getMaxOffset());
            }
            PullResult at = c.pull(mq, "*", c.maxOffset(mq), 32);
            PullResult beyond = c.pull(mq, "*", c.maxOffset(mq) + 5, 32);
            PullResult odd = c.pull(mq, "even", 0, 32);
            c.updateConsumeOffset(mq, 1); long fetched = c.fetchConsumeOffset(mq, false);
            long fromStore = c.fetchConsumeOffset(mq, true);
            out(f, "queues=" + mqs.size() + " total=" + total + " even=" + even + " atMax=" + at.getPullStatus() + " beyond=" + beyond.getPullStatus()
                + " nextAtMax=" + (at.getNextBeginOffset() == beyond.getNextBeginOffset()) + " filtered=" + odd.getPullStatus() + " fetchMem=" + fetched + " fetchStore=" + fromStore);
            c.shutdown(); break; }
        case "lite": {
            for (int i = 0; i < 8; i++) p.send(new Message(topic, "a", ("x" + i).getBytes()));
            DefaultLitePullConsumer c = new DefaultLitePullConsumer("CF_lite" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_lite" + run);
            c.subscribe(topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET); c.start();
            int n = 0; long end = System.currentTimeMillis() + 20000;
            while (n < 8 && System.currentTimeMillis() < end) n += c.poll(1000).size();
            c.commitSync(); Thread.sleep(200); c.shutdown(); out(f, n); break; }
        case "liteassign": {
            for (int i = 0; i < 8; i++) p.send(new Message(topic, "a", ("x" + i).getBytes()));
            DefaultLitePullConsumer c = new DefaultLitePullConsumer("CF_litea" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_litea" + run); c.start();
            List<MessageQueue> mqs = new ArrayList<>(c.fetchMessageQueues(topic)); Collections.sort(mqs);
            c.assign(mqs); for (MessageQueue q : mqs) c.seek(q, 1);
            int n = 0; long end = System.currentTimeMillis() + 20000;
            while (n < 4 && System.currentTimeMillis() < end) n += c.poll(1000).size();
            long committed = c.committed(mqs.get(0));
            c.seekToBegin(mqs.get(0)); int again = 0; end = System.currentTimeMillis() + 5000;
            while (again < 1 && System.currentTimeMillis() < end) again += c.poll(500).size();
            c.shutdown(); out(f, "queues=" + mqs.size() + " fromOffset1=" + n + " again>=1:" + (again >= 1)); break; }
        case "broadcast": {
            for (int i = 0; i < 4; i++) p.send(new Message(topic, "a", ("x" + i).getBytes()));
            AtomicInteger n1 = new AtomicInteger(), n2 = new AtomicInteger();
            DefaultMQPushConsumer c1 = push("CF_bc", topic, "*"); c1.setInstanceName("bc1" + run); c1.setMessageModel(MessageModel.BROADCASTING);
            DefaultMQPushConsumer c2 = push("CF_bc", topic, "*"); c2.setInstanceName("bc2" + run); c2.setMessageModel(MessageModel.BROADCASTING);
            c1.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { n1.addAndGet(ms.size()); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c2.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { n2.addAndGet(ms.size()); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c1.start(); c2.start(); waitFor(() -> n1.get() >= 4 && n2.get() >= 4, 20000); Thread.sleep(500); c1.shutdown(); c2.shutdown();
            out(f, n1.get() + "," + n2.get()); break; }
        case "retry": {
            p.send(new Message(topic, "a", "r".getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); List<String> seen = Collections.synchronizedList(new ArrayList<>()); AtomicLong first = new AtomicLong();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { MessageExt m = ms.get(0);
                long now = System.currentTimeMillis(); if (first.get() == 0) first.set(now);
                seen.add("rt=" + m.getReconsumeTimes() + " topic=" + m.getTopic() + " RETRY_TOPIC=" + m.getProperty("RETRY_TOPIC") + " ORIGIN=" + (m.getProperty("ORIGIN_MESSAGE_ID") != null) + " dt>=9s:" + (now - first.get() >= 9000));
                return m.getReconsumeTimes() == 0 ? ConsumeConcurrentlyStatus.RECONSUME_LATER : ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> seen.size() >= 2, 40000); c.shutdown(); out(f, seen); break; }
        case "dlq": {
            p.send(new Message(topic, "a", "d".getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); c.setMaxReconsumeTimes(1); AtomicInteger n = new AtomicInteger();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { n.incrementAndGet(); return ConsumeConcurrentlyStatus.RECONSUME_LATER; });
            c.start(); waitFor(() -> n.get() >= 2, 40000); Thread.sleep(3000); c.shutdown();
            DefaultMQPullConsumer pc = new DefaultMQPullConsumer("CF_dlqr" + run); pc.setNamesrvAddr(ns); pc.setInstanceName("CF_dlqr" + run); pc.start();
            String dlq = "%DLQ%CF_dlq" + run; String res;
            try { Set<MessageQueue> mqs = pc.fetchSubscribeMessageQueues(dlq); MessageQueue q = mqs.iterator().next();
                PullResult r = pc.pull(q, "*", 0, 32); res = "queues=" + mqs.size() + " pull=" + r.getPullStatus() + " n=" + (r.getMsgFoundList() == null ? 0 : r.getMsgFoundList().size());
                if (r.getMsgFoundList() != null) { MessageExt m = r.getMsgFoundList().get(0); res += " rt=" + m.getReconsumeTimes() + " RETRY_TOPIC=" + m.getProperty("RETRY_TOPIC") + " tags=" + m.getTags(); }
            } catch (Throwable t) { res = "EXC " + err(t); }
            pc.shutdown(); out(f, "deliveries=" + n.get() + " " + res); break; }
        case "query": {
            Message m = new Message(topic, "a", "qkey" + run, "q".getBytes()); long before = System.currentTimeMillis(); SendResult r = p.send(m);
            Thread.sleep(1200);
            MessageExt v = p.viewMessage(r.getOffsetMsgId());
            QueryResult qr = p.queryMessage(topic, "qkey" + run, 32, before - 10000, System.currentTimeMillis() + 10000);
            MessageExt byUniq = p.viewMessage(topic, r.getMsgId());
            MessageQueue mq = r.getMessageQueue();
            out(f, "view=" + new String(v.getBody()) + " query=" + qr.getMessageList().size() + " byUniq=" + new String(byUniq.getBody())
                + " max=" + p.maxOffset(mq) + " min=" + p.minOffset(mq) + " search(before)=" + p.searchOffset(mq, before - 5000)
                + " search(after)=" + p.searchOffset(mq, System.currentTimeMillis() + 5000) + " earliestOk=" + (Math.abs(p.earliestMsgStoreTime(mq) - before) < 5000));
            break; }
        case "badqueue": {
            p.send(new Message(topic, "a", "w".getBytes()));
            try { SendResult r = p.send(new Message(topic, "a", "x".getBytes()), new MessageQueue(topic, "broker-a", 99)); out(f, r.getSendStatus() + " q=" + r.getMessageQueue().getQueueId()); }
            catch (Throwable t) { out(f, err(t).replaceAll("\\d+\\.\\d+\\.\\d+\\.\\d+:\\d+", "ADDR")); }
            break; }
        case "reply": {
            DefaultMQProducer rp = producer("PF_reply");
            p.send(new Message(topic, "a", "warm0".getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*");
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> {
                for (MessageExt m : ms) try { Message reply = MessageUtil.createReplyMessage(m, ("re:" + new String(m.getBody())).getBytes());
                    rp.send(reply); } catch (Throwable t) { /* the warm-up messages carry no REPLY_TO_CLIENT: refused */ }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start();
            p.send(new Message(topic, "a", "warm".getBytes()));
            Thread.sleep(2000);
            try { Message r = p.request(new Message(topic, "a", "ping".getBytes()), 8000);
                out(f, new String(r.getBody()) + " topic=" + r.getTopic() + " MSG_TYPE=" + r.getProperty("MSG_TYPE"));
            } catch (Throwable t) { out(f, "EXC " + err(t)); }
            c.shutdown(); rp.shutdown(); break; }
        case "trace": {
            DefaultMQProducer tp = new DefaultMQProducer("PF_trace" + run, true); tp.setNamesrvAddr(ns); tp.setInstanceName("PF_trace" + run); tp.start();
            tp.send(new Message(topic, "a", "tkey" + run, "t".getBytes())); Thread.sleep(3000); tp.shutdown();
            DefaultMQPullConsumer pc = new DefaultMQPullConsumer("CF_trace" + run); pc.setNamesrvAddr(ns); pc.setInstanceName("CF_trace" + run); pc.start();
            int hits = 0; String sample = "";
            for (MessageQueue q : pc.fetchSubscribeMessageQueues("RMQ_SYS_TRACE_TOPIC")) {
                PullResult r = pc.pull(q, "*", 0, 32);
                if (r.getMsgFoundList() != null) for (MessageExt m : r.getMsgFoundList()) { String b = new String(m.getBody()); if (b.contains("tkey" + run)) { hits++; sample = b.substring(0, 3) + " keys=" + m.getKeys().contains("tkey" + run); } }
            }
            pc.shutdown(); out(f, "traceMsgs=" + hits + " " + sample); break; }
        case "batchprops": {
            List<Message> batch = new ArrayList<>();
            for (int i = 0; i < 2; i++) { Message m = new Message(topic, "TB", "bk" + i, ("b" + i).getBytes()); m.putUserProperty("u", "v" + i); batch.add(m); }
            SendResult r = p.send(batch, new MessageQueue(topic, r0(p, topic), 0));
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_bp" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_bp" + run); c.start();
            PullResult pr = c.pull(r.getMessageQueue(), "*", 0, 32);
            StringBuilder sb = new StringBuilder();
            for (MessageExt m : pr.getMsgFoundList()) { TreeMap<String, String> pp = new TreeMap<>(m.getProperties()); pp.remove("UNIQ_KEY"); pp.remove("MIN_OFFSET"); pp.remove("MAX_OFFSET");
                sb.append(" [size=").append(m.getStoreSize()).append(" props=").append(pp).append(" sys=").append(m.getSysFlag()).append("]"); }
            c.shutdown(); out(f, pr.getPullStatus() + sb.toString()); break; }
        case "delaymax": {
            Message m = new Message(topic, "a", "d".getBytes()); m.setDelayTimeLevel(25);
            SendResult r = p.send(m);
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_dm" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_dm" + run); c.start();
            String res = "";
            for (MessageQueue q : c.fetchSubscribeMessageQueues("SCHEDULE_TOPIC_XXXX")) {
                if (q.getQueueId() < 17) continue;
                PullResult pr = c.pull(q, "*", 0, 32);
                if (pr.getMsgFoundList() != null) for (MessageExt x : pr.getMsgFoundList()) if (x.getProperty("REAL_TOPIC").equals(topic)) res += "q" + q.getQueueId() + " DELAY=" + x.getProperty("DELAY") + " ";
            }
            c.shutdown(); out(f, res + "status=" + r.getSendStatus()); break; }
        case "readonly": {
            p.send(new Message(topic, "a", "w".getBytes()));
            org.apache.rocketmq.tools.admin.DefaultMQAdminExt admin = new org.apache.rocketmq.tools.admin.DefaultMQAdminExt(); admin.setNamesrvAddr(ns); admin.setInstanceName("adm" + run); admin.start();
            org.apache.rocketmq.common.TopicConfig tc = new org.apache.rocketmq.common.TopicConfig(topic, 4, 4, 4);
            String addr = admin.examineTopicRouteInfo(topic).getBrokerDatas().get(0).selectBrokerAddr();
            admin.createAndUpdateTopicConfig(addr, tc); admin.shutdown();
            Thread.sleep(500);
            try { SendResult r = p.send(new Message(topic, "a", "x".getBytes()), new MessageQueue(topic, "broker-a", 0)); out(f, r.getSendStatus()); } catch (Throwable t) { out(f, err(t).replaceAll("\\d+\\.\\d+\\.\\d+\\.\\d+:\\d+", "ADDR")); }
            break; }
        case "orderlysuspend": {
            MessageQueue mq0 = null;
            for (int i = 0; i < 3; i++) mq0 = p.send(new Message(topic, "a", ("o" + i).getBytes()), (mqs, m, arg) -> mqs.get(0), null).getMessageQueue();
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); c.setSuspendCurrentQueueTimeMillis(200); c.setMaxReconsumeTimes(2);
            List<String> seen = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerOrderly) (ms, ctx) -> { MessageExt m = ms.get(0); String b = new String(m.getBody()); seen.add(b + ":" + m.getReconsumeTimes());
                return b.equals("o1") ? ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT : ConsumeOrderlyStatus.SUCCESS; });
            c.start(); waitFor(() -> seen.contains("o2:0"), 30000); Thread.sleep(1500); c.shutdown();
            out(f, seen.toString()); break; }
        case "createtopic": {
            p.createTopic("TBW102", topic, 3);
            Thread.sleep(500);
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_ct" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_ct" + run); c.start();
            Set<MessageQueue> mqs = c.fetchSubscribeMessageQueues(topic); c.shutdown(); out(f, mqs.size()); break; }
        case "nosuch": {
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_ns" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_ns" + run); c.start();
            try { out(f, c.fetchSubscribeMessageQueues("NoSuch" + run).size()); } catch (Throwable t) { out(f, err(t)); }
            c.shutdown(); break; }
        case "pull64": {
            List<Message> batch = new ArrayList<>(); for (int i = 0; i < 70; i++) batch.add(new Message(topic, "a", ("x" + i).getBytes()));
            SendResult r = p.send(batch, new MessageQueue(topic, r0(p, topic), 0));
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_p64" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_p64" + run); c.start();
            PullResult pr = c.pull(r.getMessageQueue(), "*", 0, 64); c.shutdown(); out(f, pr.getPullStatus() + " n=" + pr.getMsgFoundList().size() + " next=" + pr.getNextBeginOffset()); break; }
        case "fromts": {
            for (int i = 0; i < 3; i++) p.send(new Message(topic, "a", ("old" + i).getBytes()));
            Thread.sleep(1500); long ts = System.currentTimeMillis(); Thread.sleep(500);
            for (int i = 0; i < 2; i++) p.send(new Message(topic, "a", ("new" + i).getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_TIMESTAMP);
            c.setConsumeTimestamp(org.apache.rocketmq.common.UtilAll.timeMillisToHumanString3(ts));
            List<String> got = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 2, 20000); Thread.sleep(1000); c.shutdown(); List<String> g = new ArrayList<>(got); Collections.sort(g); out(f, g); break; }
        case "namespace": {
            DefaultMQProducer np = new DefaultMQProducer("ns1", "PNS" + run); np.setNamesrvAddr(ns); np.setInstanceName("PNS" + run); np.start();
            SendResult r = np.send(new Message(topic, "a", "n".getBytes()));
            DefaultMQPushConsumer c = new DefaultMQPushConsumer("ns1", "CNS" + run); c.setNamesrvAddr(ns); c.setInstanceName("CNS" + run); c.subscribe(topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            List<String> got = Collections.synchronizedList(new ArrayList<>()); AtomicInteger first = new AtomicInteger();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(m.getTopic() + ":" + m.getReconsumeTimes()); return first.getAndIncrement() == 0 ? ConsumeConcurrentlyStatus.RECONSUME_LATER : ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 2, 30000); c.shutdown(); np.shutdown();
            out(f, "sendTopic=" + r.getMessageQueue().getTopic() + " got=" + got); break; }
        case "delaynext": {
            p.send(new Message(topic, "a", "r".getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); List<Long> at = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { at.add(System.currentTimeMillis()); if (ms.get(0).getReconsumeTimes() == 0) { ctx.setDelayLevelWhenNextConsume(1); return ConsumeConcurrentlyStatus.RECONSUME_LATER; } return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> at.size() >= 2, 30000); c.shutdown(); long d = at.size() >= 2 ? at.get(1) - at.get(0) : -1;
            out(f, "deliveries=" + at.size() + " gap>=0.9s:" + (d >= 900)); break; }
        case "dlqdirect": {
            p.send(new Message(topic, "a", "d".getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); AtomicInteger n = new AtomicInteger();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { n.incrementAndGet(); ctx.setDelayLevelWhenNextConsume(-1); return ConsumeConcurrentlyStatus.RECONSUME_LATER; });
            c.start(); waitFor(() -> n.get() >= 1, 20000); Thread.sleep(3000); c.shutdown();
            DefaultMQPullConsumer pc = new DefaultMQPullConsumer("CF_dd" + run); pc.setNamesrvAddr(ns); pc.setInstanceName("CF_dd" + run); pc.start(); String res;
            try { MessageQueue q = pc.fetchSubscribeMessageQueues("%DLQ%CF_dlqdirect" + run).iterator().next(); PullResult r = pc.pull(q, "*", 0, 32);
                res = r.getPullStatus() + " n=" + (r.getMsgFoundList() == null ? 0 : r.getMsgFoundList().size()) + (r.getMsgFoundList() == null ? "" : " rt=" + r.getMsgFoundList().get(0).getReconsumeTimes()); } catch (Throwable t) { res = "EXC " + err(t); }
            pc.shutdown(); out(f, "deliveries=" + n.get() + " " + res); break; }
        case "bigprops": {
            Message m = new Message(topic, "a", "b".getBytes()); StringBuilder sb = new StringBuilder(); for (int i = 0; i < 33000; i++) sb.append('x'); m.putUserProperty("big", sb.toString());
            try { out(f, p.send(m).getSendStatus()); } catch (Throwable t) { out(f, err(t).replaceAll("\\d+\\.\\d+\\.\\d+\\.\\d+:\\d+", "ADDR")); } break; }
        case "multikey": {
            Message m = new Message(topic, "a", "b".getBytes()); m.setKeys(Arrays.asList("mk1" + run, "mk2" + run)); long before = System.currentTimeMillis(); p.send(m); Thread.sleep(1200);
            out(f, "k1=" + p.queryMessage(topic, "mk1" + run, 32, before - 10000, System.currentTimeMillis() + 1000).getMessageList().size() + " k2=" + p.queryMessage(topic, "mk2" + run, 32, before - 10000, System.currentTimeMillis() + 1000).getMessageList().size()
                + " both=" + p.queryMessage(topic, "mk1" + run + " mk2" + run, 32, before - 10000, System.currentTimeMillis() + 1000).getMessageList().size()); break; }
        case "emptybody": {
            try { out(f, p.send(new Message(topic, "a", new byte[0])).getSendStatus()); } catch (Throwable t) { out(f, err(t)); } break; }
        case "sendtimeout": {
            p.send(new Message(topic, "a", "w".getBytes()));
            try { out(f, p.send(new Message(topic, "a", "t".getBytes()), 1).getSendStatus()); } catch (Throwable t) { out(f, t.getClass().getSimpleName()); } break; }
        case "subtrace": {
            p.send(new Message(topic, "a", "stkey" + run, "t".getBytes()));
            DefaultMQPushConsumer c = new DefaultMQPushConsumer("CF_st" + run, true); c.setNamesrvAddr(ns); c.setInstanceName("CF_st" + run);
            c.subscribe(topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET); AtomicInteger n = new AtomicInteger();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { n.addAndGet(ms.size()); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> n.get() >= 1, 20000); Thread.sleep(3000); c.shutdown();
            DefaultMQPullConsumer pc = new DefaultMQPullConsumer("CF_str" + run); pc.setNamesrvAddr(ns); pc.setInstanceName("CF_str" + run); pc.start();
            TreeSet<String> kinds = new TreeSet<>();
            for (MessageQueue q : pc.fetchSubscribeMessageQueues("RMQ_SYS_TRACE_TOPIC")) { PullResult r = pc.pull(q, "*", 0, 32);
                if (r.getMsgFoundList() != null) for (MessageExt m : r.getMsgFoundList()) { String b = new String(m.getBody()); if (b.contains("CF_st" + run)) for (String part : b.split("\u0002")) if (part.startsWith("Sub")) kinds.add(part.split("\u0001")[0]); } }
            pc.shutdown(); out(f, "consumed=" + n.get() + " traceKinds=" + kinds); break; }
        case "fromlast": {
            for (int i = 0; i < 3; i++) p.send(new Message(topic, "a", ("h" + i).getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET); List<String> got = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); Thread.sleep(4000); p.send(new Message(topic, "a", "new".getBytes())); waitFor(() -> got.contains("new"), 20000); Thread.sleep(500); c.shutdown();
            List<String> g = new ArrayList<>(got); Collections.sort(g); out(f, g); break; }
        case "litecommit": {
            for (int i = 0; i < 6; i++) p.send(new Message(topic, "a", ("x" + i).getBytes()));
            DefaultLitePullConsumer c = new DefaultLitePullConsumer("CF_lc" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_lc" + run);
            c.subscribe(topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET); c.setAutoCommit(false); c.setPullBatchSize(2); c.start();
            int n = 0; long end = System.currentTimeMillis() + 20000;
            while (n < 6 && System.currentTimeMillis() < end) n += c.poll(1000).size();
            c.commitSync(); Thread.sleep(6000); c.shutdown();
            for (int i = 0; i < 2; i++) p.send(new Message(topic, "a", ("y" + i).getBytes()));
            DefaultLitePullConsumer c2 = new DefaultLitePullConsumer("CF_lc" + run); c2.setNamesrvAddr(ns); c2.setInstanceName("CF_lc2" + run);
            c2.subscribe(topic, "*"); c2.start(); List<String> got = new ArrayList<>(); end = System.currentTimeMillis() + 20000;
            while (got.size() < 2 && System.currentTimeMillis() < end) for (MessageExt m : c2.poll(1000)) got.add(new String(m.getBody()));
            c2.shutdown(); Collections.sort(got); out(f, "first=" + n + " resumed=" + got); break; }
        case "litetime": {
            for (int i = 0; i < 3; i++) p.send(new Message(topic, "a", ("o" + i).getBytes()), new MessageQueue(topic, r0(p, topic), 0));
            Thread.sleep(1200); long ts = System.currentTimeMillis(); Thread.sleep(300);
            for (int i = 0; i < 2; i++) p.send(new Message(topic, "a", ("n" + i).getBytes()), new MessageQueue(topic, "broker-a", 0));
            DefaultLitePullConsumer c = new DefaultLitePullConsumer("CF_lt" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_lt" + run); c.start();
            MessageQueue q0 = null; for (MessageQueue q : c.fetchMessageQueues(topic)) if (q.getQueueId() == 0) q0 = q;
            long off = c.offsetForTimestamp(q0, ts); c.assign(Collections.singletonList(q0)); c.seekToEnd(q0);
            Thread.sleep(300); int atEnd = c.poll(1000).size(); c.seek(q0, off); List<String> got = new ArrayList<>(); long end = System.currentTimeMillis() + 10000;
            while (got.size() < 2 && System.currentTimeMillis() < end) for (MessageExt m : c.poll(1000)) got.add(new String(m.getBody()));
            c.shutdown(); out(f, "offsetForTs=" + off + " afterSeekToEnd=" + atEnd + " fromTs=" + got); break; }
        case "orderlybc": {
            for (int i = 0; i < 4; i++) p.send(new Message(topic, "a", ("x" + i).getBytes()), (mqs, m, arg) -> mqs.get(0), null);
            DefaultMQPushConsumer c = push("CF_obc", topic, "*"); c.setInstanceName("obc" + run); c.setMessageModel(MessageModel.BROADCASTING);
            List<String> got = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerOrderly) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeOrderlyStatus.SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 4, 20000); Thread.sleep(500); c.shutdown(); out(f, got); break; }
        case "vip": {
            // vipChannelEnabled (the default of clients up to 4.4): sends, heartbeats and
            // offsets go to listenPort - 2, pulls to listenPort
            DefaultMQProducer vp = new DefaultMQProducer("PF_vip" + run); vp.setNamesrvAddr(ns); vp.setInstanceName("vip" + run);
            vp.setVipChannelEnabled(true); vp.start();
            List<String> sent = new ArrayList<>();
            for (int i = 0; i < 3; i++) sent.add(vp.send(new Message(topic, "a", ("x" + i).getBytes())).getSendStatus().toString());
            DefaultMQPushConsumer c = push("CF_vip", topic, "*"); c.setVipChannelEnabled(true);
            Set<String> got = new ConcurrentSkipListSet<>();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 3, 20000); c.shutdown(); vp.shutdown(); out(f, sent + " " + got); break; }
        case "tls": {
            // useTLS (-Dtls.enable=true): every connection, the nameserver's too, over TLS; the
            // client's test mode (its default) takes the server's self-signed certificate
            DefaultMQProducer tp = new DefaultMQProducer("PF_tls" + run); tp.setNamesrvAddr(ns); tp.setInstanceName("tls" + run);
            tp.setUseTLS(true); tp.start();
            List<String> sent = new ArrayList<>();
            for (int i = 0; i < 3; i++) sent.add(tp.send(new Message(topic, "a", ("t" + i).getBytes())).getSendStatus().toString());
            DefaultMQPushConsumer c = push("CF_tls", topic, "*"); c.setUseTLS(true);
            Set<String> got = new ConcurrentSkipListSet<>();
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 3, 20000); c.shutdown(); tp.shutdown(); out(f, sent + " " + got); break; }
        case "replyns": {
            // request-reply between clients of one namespace: the request's reply topic and the
            // reply's return trip carry the namespace's prefix
            DefaultMQProducer rq = new DefaultMQProducer("ns1", "PRN" + run); rq.setNamesrvAddr(ns); rq.setInstanceName("PRN" + run); rq.start();
            DefaultMQProducer rp = new DefaultMQProducer("ns1", "PRNR" + run); rp.setNamesrvAddr(ns); rp.setInstanceName("PRNR" + run); rp.start();
            rq.send(new Message(topic, "a", "warm0".getBytes()));
            DefaultMQPushConsumer c = new DefaultMQPushConsumer("ns1", "CRN" + run); c.setNamesrvAddr(ns); c.setInstanceName("CRN" + run); c.subscribe(topic, "*"); c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            List<String> asked = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> {
                for (MessageExt m : ms) try { if (m.getProperty("REPLY_TO_CLIENT") == null) continue; asked.add(m.getTopic() + " CLUSTER=" + m.getProperty("CLUSTER"));
                    rp.send(MessageUtil.createReplyMessage(m, ("re:" + new String(m.getBody())).getBytes())); } catch (Throwable t) { asked.add("EXC " + err(t)); }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); Thread.sleep(2000);
            try { Message r = rq.request(new Message(topic, "a", "ping".getBytes()), 8000);
                out(f, new String(r.getBody()) + " topic=" + r.getTopic() + " MSG_TYPE=" + r.getProperty("MSG_TYPE") + " asked=" + asked);
            } catch (Throwable t) { out(f, "EXC " + err(t) + " asked=" + asked); }
            c.shutdown(); rp.shutdown(); rq.shutdown(); break; }
        case "requestasync": {
            DefaultMQProducer rp = producer("PF_ra");
            p.send(new Message(topic, "a", "warm0".getBytes()));
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*");
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> {
                for (MessageExt m : ms) try { if (m.getProperty("REPLY_TO_CLIENT") != null) rp.send(MessageUtil.createReplyMessage(m, ("re:" + new String(m.getBody())).getBytes())); } catch (Throwable t) { }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); Thread.sleep(2000);
            CountDownLatch l = new CountDownLatch(3); List<String> got = Collections.synchronizedList(new ArrayList<>());
            for (int i = 0; i < 3; i++) p.request(new Message(topic, "a", ("q" + i).getBytes()), new RequestCallback() {
                public void onSuccess(Message m) { got.add(new String(m.getBody())); l.countDown(); }
                public void onException(Throwable e) { got.add("EXC " + err(e)); l.countDown(); } }, 8000);
            l.await(10, TimeUnit.SECONDS); c.shutdown(); rp.shutdown();
            List<String> g = new ArrayList<>(got); Collections.sort(g); out(f, g); break; }
        case "longpoll": {
            // a pull at the queue's end is held by the broker until a message arrives
            p.send(new Message(topic, "a", "w".getBytes()), new MessageQueue(topic, r0(p, topic), 0));
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_lp" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_lp" + run); c.start();
            MessageQueue q0 = new MessageQueue(topic, "broker-a", 0);
            long max = c.maxOffset(q0); long t0 = System.currentTimeMillis();
            new Thread(() -> { try { Thread.sleep(1500); p.send(new Message(topic, "a", "late".getBytes()), q0); } catch (Throwable t) { } }).start();
            PullResult r = c.pullBlockIfNotFound(q0, "*", max, 32); long dt = System.currentTimeMillis() - t0;
            c.shutdown();
            out(f, r.getPullStatus() + " body=" + (r.getMsgFoundList() == null ? "-" : new String(r.getMsgFoundList().get(0).getBody())) + " held>=1.4s:" + (dt >= 1400) + " <6s:" + (dt < 6000)); break; }
        case "suspend": {
            // suspend() stops the client's pulls (the one the broker holds still answers), resume()
            // goes on from where they stopped
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); List<String> got = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            p.send(new Message(topic, "a", "s0".getBytes()), new MessageQueue(topic, r0(p, topic), 0));
            c.start(); waitFor(() -> got.contains("s0"), 20000);
            c.suspend(); Thread.sleep(500);
            for (MessageQueue q : p.fetchPublishMessageQueues(topic)) p.send(new Message(topic, "a", ("h" + q.getQueueId()).getBytes()), q);
            Thread.sleep(1500); int held = got.size(); // the pulls the broker held when suspend() came
            for (int i = 1; i < 3; i++) p.send(new Message(topic, "a", ("s" + i).getBytes()));
            Thread.sleep(3000); int whileSuspended = got.size() - held;
            c.resume(); waitFor(() -> got.size() >= 8, 20000); Thread.sleep(500); c.shutdown();
            List<String> g = new ArrayList<>(got); Collections.sort(g); out(f, "whileSuspended=" + whileSuspended + " all=" + g); break; }
        case "storedoffset": {
            // a group's offset as the broker stores it: none yet, then the one the client persisted
            p.send(new Message(topic, "a", "w".getBytes()), new MessageQueue(topic, r0(p, topic), 0));
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_so" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_so" + run); c.start();
            MessageQueue q0 = new MessageQueue(topic, "broker-a", 0);
            long none = c.fetchConsumeOffset(q0, true);
            c.updateConsumeOffset(q0, 1); c.getOffsetStore().persist(q0); Thread.sleep(500);
            long stored = c.fetchConsumeOffset(q0, true);
            c.shutdown(); out(f, "none=" + none + " stored=" + stored); break; }
        case "pullsql": {
            // a pull consumer's SQL92 selector, sent in the pull request itself, is applied by the
            // broker (the client asks only brokers its heartbeat told it are new enough)
            for (int i = 0; i < 6; i++) { Message m = new Message(topic, "a", ("x" + i).getBytes()); m.putUserProperty("n", Integer.toString(i)); p.send(m, new MessageQueue(topic, r0(p, topic), 0)); }
            DefaultMQPullConsumer c = new DefaultMQPullConsumer("CF_ps" + run); c.setNamesrvAddr(ns); c.setInstanceName("CF_ps" + run);
            c.setRegisterTopics(Collections.singleton(topic)); c.start();
            org.apache.rocketmq.client.impl.factory.MQClientInstance cf = org.apache.rocketmq.client.impl.MQClientManager.getInstance().getOrCreateMQClientInstance(c);
            waitFor(() -> { cf.updateTopicRouteInfoFromNameServer(topic); cf.sendHeartbeatToAllBrokerWithLock(); String a = cf.findBrokerAddressInPublish("broker-a"); return a != null && cf.findBrokerVersion("broker-a", a) > 0; }, 10000);
            MessageQueue q0 = new MessageQueue(topic, "broker-a", 0); String res = "";
            try { PullResult r = c.pull(q0, MessageSelector.bySql("n >= 3"), 0, 32); List<String> got = new ArrayList<>();
                if (r.getMsgFoundList() != null) for (MessageExt m : r.getMsgFoundList()) got.add(new String(m.getBody()));
                res = r.getPullStatus() + " " + got + " next=" + r.getNextBeginOffset();
                PullResult bad = c.pull(q0, MessageSelector.bySql("n >>> 3"), 0, 32); res += " bad=" + bad.getPullStatus() + " n=" + (bad.getMsgFoundList() == null ? 0 : bad.getMsgFoundList().size()); } catch (Throwable t) { res += " EXC " + err(t); }
            c.shutdown(); out(f, res); break; }
        case "orderly2": {
            // a second orderly consumer joins the group: the first gives up half of the queues,
            // the second locks them (LOCK_BATCH_MQ) and goes on from the stored offsets, in order
            for (int q = 0; q < 4; q++) for (int i = 0; i < 5; i++) { final int qq = q; p.send(new Message(topic, "a", (q + ":" + i).getBytes()), (mqs, m, arg) -> mqs.get(qq), null); }
            Map<String, List<String>> byQueue = new ConcurrentHashMap<>(); List<String> round2 = Collections.synchronizedList(new ArrayList<>()); AtomicInteger n = new AtomicInteger();
            List<DefaultMQPushConsumer> cs = new ArrayList<>();
            for (int k = 0; k < 2; k++) { final String who = "c" + k;
                DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); c.setInstanceName("o2" + k + run);
                c.registerMessageListener((MessageListenerOrderly) (ms, ctx) -> { for (MessageExt m : ms) { String b = new String(m.getBody()); String q = b.split(":")[0];
                    byQueue.computeIfAbsent(q, x -> Collections.synchronizedList(new ArrayList<>())).add(b); if (Integer.parseInt(b.split(":")[1]) >= 5) round2.add(q + "@" + who); n.incrementAndGet(); } return ConsumeOrderlyStatus.SUCCESS; });
                cs.add(c); }
            cs.get(0).start(); waitFor(() -> n.get() >= 20, 30000); int first = n.get();
            cs.get(1).start();
            java.util.function.Function<DefaultMQPushConsumer, Integer> locked = c -> { int l = 0;
                for (Map.Entry<MessageQueue, org.apache.rocketmq.client.impl.consumer.ProcessQueue> e : c.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable().entrySet())
                    if (e.getKey().getTopic().equals(topic) && e.getValue().isLocked() && !e.getValue().isDropped()) l++; return l; };
            waitFor(() -> locked.apply(cs.get(0)) == 2 && locked.apply(cs.get(1)) == 2, 60000);
            String split = locked.apply(cs.get(0)) + "+" + locked.apply(cs.get(1));
            for (int q = 0; q < 4; q++) for (int i = 5; i < 10; i++) { final int qq = q; p.send(new Message(topic, "a", (q + ":" + i).getBytes()), (mqs, m, arg) -> mqs.get(qq), null); }
            waitFor(() -> n.get() >= 40, 30000); Thread.sleep(1000); for (DefaultMQPushConsumer c : cs) c.shutdown();
            boolean inOrder = true; for (Map.Entry<String, List<String>> e : byQueue.entrySet()) { List<String> l = e.getValue();
                for (int i = 0; i < l.size(); i++) if (!l.get(i).equals(e.getKey() + ":" + i)) inOrder = false; }
            Map<String, Set<String>> owners = new TreeMap<>(); for (String x : round2) owners.computeIfAbsent(x.split("@")[0], y -> new TreeSet<>()).add(x.split("@")[1]);
            Map<String, Integer> perConsumer = new TreeMap<>(); boolean oneOwner = true;
            for (Set<String> o : owners.values()) { if (o.size() != 1) oneOwner = false; for (String w : o) perConsumer.merge(w, 1, Integer::sum); }
            out(f, "first=" + first + " locked=" + split + " total=" + n.get() + " inOrder=" + inOrder + " round2OneOwnerEach=" + oneOwner + " round2QueuesPerConsumer=" + perConsumer.values()); break; }
        case "mixed": {
            // idemp's runner (`idemp consume`, -Didemp.bin) and a Java push consumer in ONE group:
            // both allocate the queues alike (AllocateMessageQueueAveragely, sorted client ids),
            // so each queue is read by one of them and each message consumed once
            r0(p, topic);
            java.io.File rec = java.io.File.createTempFile("mixed", ".jsonl"), ev = java.io.File.createTempFile("mixed", ".err");
            Process ip = new ProcessBuilder(System.getProperty("idemp.bin", "idemp"), "consume", "--namesrv", ns, "--topic", topic,
                "--group", "CF_mixed" + run, "--from", "first", "--record", rec.getPath(), "--body").redirectError(ev).start();
            java.util.function.Supplier<List<String>> lines = () -> { try { return java.nio.file.Files.readAllLines(ev.toPath()); } catch (Exception e) { return new ArrayList<>(); } };
            waitFor(() -> lines.get().stream().anyMatch(l -> l.contains("\"started\"")), 30000);
            DefaultMQPushConsumer c = push("CF_mixed", topic, "*"); List<String> javaGot = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) javaGot.add(m.getQueueId() + "/" + new String(m.getBody())); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start();
            java.util.function.IntSupplier javaQueues = () -> { int n = 0; for (MessageQueue q : c.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable().keySet()) if (q.getTopic().equals(topic)) n++; return n; };
            java.util.function.IntSupplier idempQueues = () -> { int n = -1; for (String l : lines.get()) if (l.contains("\"queues\"") && l.contains(topic + "\"")) { String qs = l.replaceAll(".*\"queues\": \\[([0-9, ]*)\\].*", "$1").trim(); n = qs.isEmpty() ? 0 : qs.split(",").length; } return n; };
            waitFor(() -> javaQueues.getAsInt() == 2 && idempQueues.getAsInt() == 2, 40000);
            String split = javaQueues.getAsInt() + "+" + idempQueues.getAsInt();
            for (int q = 0; q < 4; q++) for (int i = 0; i < 5; i++) p.send(new Message(topic, "a", ("m" + q + "-" + i).getBytes()), new MessageQueue(topic, "broker-a", q));
            java.util.function.Supplier<List<String>> idempGot = () -> { List<String> out = new ArrayList<>(); try { for (String l : java.nio.file.Files.readAllLines(rec.toPath()))
                out.add(l.replaceAll(".*\"queue\": (\\d+),.*", "$1") + "/" + l.replaceAll(".*\"body\": \"([^\"]*)\".*", "$1")); } catch (Exception e) { } return out; };
            java.util.function.Supplier<List<String>> both = () -> { List<String> all = new ArrayList<>(javaGot); all.addAll(idempGot.get()); all.removeIf(x -> !x.contains("/m")); return all; };
            waitFor(() -> both.get().size() >= 20, 30000); Thread.sleep(1000);
            ip.destroy(); ip.waitFor(20, TimeUnit.SECONDS); c.shutdown();
            Set<String> jq = new TreeSet<>(), iq = new TreeSet<>(); for (String x : javaGot) if (x.contains("/m")) jq.add(x.split("/")[0]); for (String x : idempGot.get()) if (x.contains("/m")) iq.add(x.split("/")[0]);
            Set<String> overlap = new TreeSet<>(jq); overlap.retainAll(iq);
            out(f, "split=" + split + " total=" + both.get().size() + " distinct=" + new HashSet<>(both.get()).size() + " javaQueues=" + jq.size() + " idempQueues=" + iq.size() + " overlap=" + overlap.size());
            rec.delete(); ev.delete(); break; }
        case "tx": {
            TransactionMQProducer tp = new TransactionMQProducer("PF_tx" + run); tp.setNamesrvAddr(ns); tp.setInstanceName("PF_tx" + run);
            List<String> checks = Collections.synchronizedList(new ArrayList<>());
            tp.setTransactionListener(new TransactionListener() {
                public LocalTransactionState executeLocalTransaction(Message m, Object arg) {
                    String b = new String(m.getBody()); return b.equals("commit") ? LocalTransactionState.COMMIT_MESSAGE : b.equals("rollback") ? LocalTransactionState.ROLLBACK_MESSAGE : LocalTransactionState.UNKNOW; }
                public LocalTransactionState checkLocalTransaction(MessageExt m) { checks.add(new String(m.getBody()) + ":" + m.getProperty("TRANSACTION_CHECK_TIMES")); return LocalTransactionState.COMMIT_MESSAGE; } });
            tp.start();
            List<String> st = new ArrayList<>();
            for (String b : new String[]{"commit", "rollback", "unknown"}) st.add(tp.sendMessageInTransaction(new Message(topic, "a", b.getBytes()), null).getLocalTransactionState().toString());
            DefaultMQPushConsumer c = push("CF_" + f, topic, "*"); List<String> got = Collections.synchronizedList(new ArrayList<>());
            c.registerMessageListener((MessageListenerConcurrently) (ms, ctx) -> { for (MessageExt m : ms) got.add(new String(m.getBody()) + "/TRAN_MSG=" + m.getProperty("TRAN_MSG") + "/PGROUP=" + (m.getProperty("PGROUP") != null) + "/sys=" + m.getSysFlag()); return ConsumeConcurrentlyStatus.CONSUME_SUCCESS; });
            c.start(); waitFor(() -> got.size() >= 2, 60000); Thread.sleep(2000); c.shutdown(); tp.shutdown();
            List<String> g = new ArrayList<>(got); Collections.sort(g);
            out(f, "states=" + st + " got=" + g + " checks=" + new ArrayList<>(checks)); break; }
        }
    }
}
