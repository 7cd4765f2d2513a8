"""What RocketMQ 4.9.7's broker reports for the settings idemp does not model, so that
``mqadmin getBrokerConfig`` shows every key a script may read (``mqadmin exportConfigs``
reads ``brokerRole``, ``fileReservedTime``, ``useTLS`` and others, and fails on a missing
one). Values are RocketMQ's defaults as its broker reports them (``BrokerConfig``,
``MessageStoreConfig``, ``NettyServerConfig``, ``NettyClientConfig``); a broker.conf or
``updateBrokerConfig`` value for one of these keys is reported instead, and otherwise
ignored. Those that RocketMQ derives from the machine or from other settings are
computed the way it computes them.
"""

from __future__ import annotations

import os

STATIC: dict[str, str] = {
    "accessMessageInMemoryMaxRatio": "40",
    "adminBrokerThreadPoolNums": "16",
    "autoDeleteUnusedStats": "false",
    "bitMapLengthConsumeQueueExt": "112",
    "brokerFastFailureEnable": "true",
    "brokerRole": "ASYNC_MASTER",
    "brokerTopicEnable": "true",
    "channelNotActiveInterval": "60000",
    "checkCRCOnRecover": "true",
    "cleanFileForciblyEnable": "true",
    "cleanResourceInterval": "10000",
    "clientAsyncSemaphoreValue": "65535",
    "clientChannelMaxIdleTimeSeconds": "120",
    "clientCloseSocketIfTimeout": "true",
    "clientManageThreadPoolNums": "32",
    "clientManagerThreadPoolQueueCapacity": "1000000",
    "clientOnewaySemaphoreValue": "65535",
    "clientPooledByteBufAllocatorEnable": "false",
    "clientSocketRcvBufSize": "0",
    "clientSocketSndBufSize": "0",
    "clientWorkerThreads": "4",
    "clusterTopicEnable": "true",
    "commercialBaseCount": "1",
    "commercialBigCount": "1",
    "commercialEnable": "true",
    "commercialTimerCount": "1",
    "commercialTransCount": "1",
    "commitCommitLogLeastPages": "4",
    "commitCommitLogThoroughInterval": "200",
    "commitIntervalCommitLog": "200",
    "compressedRegister": "false",
    "connectTimeoutMillis": "3000",
    "consumerFallbehindThreshold": "17179869184",
    "consumerManageThreadPoolNums": "32",
    "consumerManagerThreadPoolQueueCapacity": "1000000",
    "debugLockEnable": "false",
    "defaultQueryMaxNum": "32",
    "deleteCommitLogFilesInterval": "100",
    "deleteConsumeQueueFilesInterval": "100",
    "deleteWhen": "04",
    "destroyMapedFileIntervalForcibly": "120000",
    "disableConsumeIfConsumerReadSlowly": "false",
    "diskFallRecorded": "true",
    "diskMaxUsedSpaceRatio": "75",
    "duplicationEnable": "false",
    "enableCalcFilterBitMap": "false",
    "enableConsumeQueueExt": "false",
    "enableDLegerCommitLog": "false",
    "enableDetailStat": "true",
    "enableLmq": "false",
    "enableMultiDispatch": "false",
    "enablePropertyFilter": "false",
    "enableScheduleAsyncDeliver": "false",
    "enableScheduleMessageStats": "true",
    "endTransactionPoolQueueCapacity": "100000",
    "expectConsumerNumUseFilter": "32",
    "fastFailIfNoBufferInStorePool": "false",
    "fetchNamesrvAddrByAddressServer": "false",
    "fileReservedTime": "72",
    "filterDataCleanTimeSpan": "86400000",
    "filterServerNums": "0",
    "filterSupportRetry": "false",
    "flushCommitLogLeastPages": "4",
    "flushCommitLogThoroughInterval": "10000",
    "flushCommitLogTimed": "true",
    "flushConsumeQueueLeastPages": "2",
    "flushConsumeQueueThoroughInterval": "60000",
    "flushConsumerOffsetHistoryInterval": "60000",
    "flushDelayOffsetInterval": "10000",
    "flushIntervalConsumeQueue": "1000",
    "flushLeastPagesWhenWarmMapedFile": "4096",
    "forceRegister": "true",
    "haHousekeepingInterval": "20000",
    "haSendHeartbeatInterval": "5000",
    "haSlaveFallbehindMax": "268435456",
    "haTransferBatchSize": "32768",
    "heartbeatThreadPoolQueueCapacity": "50000",
    "highSpeedMode": "false",
    "isEnableBatchPush": "false",
    "isolateLogEnable": "false",
    "mappedFileSizeCommitLog": "1073741824",
    "mappedFileSizeConsumeQueue": "6000000",
    "mappedFileSizeConsumeQueueExt": "50331648",
    "maxDelayTime": "40",
    "maxErrorRateOfBloomFilter": "20",
    "maxHashSlotNum": "5000000",
    "maxIndexNum": "20000000",
    "maxLmqConsumeQueueNum": "20000",
    "maxMsgsNumBatch": "64",
    "maxTransferBytesOnMessageInDisk": "65536",
    "maxTransferCountOnMessageInDisk": "8",
    "messageIndexEnable": "true",
    "messageIndexSafe": "false",
    "messageStorePlugIn": "",  # no plug-in: RocketMQ reports the empty string
    "msgTraceTopicName": "RMQ_SYS_TRACE_TOPIC",
    "notifyConsumerIdsChangedEnable": "true",
    "offsetCheckInSlave": "false",
    "osPageCacheBusyTimeOutMills": "1000",
    "pullThreadPoolQueueCapacity": "100000",
    "putMsgIndexHightWater": "600000",
    "putThreadPoolQueueCapacity": "10000",
    "queryThreadPoolQueueCapacity": "20000",
    "redeleteHangedFileInterval": "120000",
    "registerBrokerTimeoutMills": "6000",
    "registerNameServerPeriod": "30000",
    "replyThreadPoolQueueCapacity": "10000",
    "scheduleAsyncDeliverMaxPendingLimit": "2000",
    "scheduleAsyncDeliverMaxResendNum2Blocked": "3",
    "sendThreadPoolQueueCapacity": "10000",
    "serverAsyncSemaphoreValue": "64",
    "serverCallbackExecutorThreads": "0",
    "serverChannelMaxIdleTimeSeconds": "120",
    "serverOnewaySemaphoreValue": "256",
    "serverPooledByteBufAllocatorEnable": "true",
    "serverSelectorThreads": "3",
    "serverSocketBacklog": "1024",
    "serverSocketRcvBufSize": "0",
    "serverSocketSndBufSize": "0",
    "serverWorkerThreads": "8",
    "slaveReadEnable": "false",
    "slaveTimeout": "3000",
    "startAcceptSendRequestTimeStamp": "0",
    "storeReplyMessageEnable": "true",
    "traceTopicEnable": "false",
    "transferMsgByHeap": "true",
    "transientStorePoolEnable": "false",
    "transientStorePoolSize": "5",
    "useEpollNativeSelector": "false",
    "useReentrantLockWhenPutMessage": "true",
    "useTLS": "false",
    "waitTimeMillsInHeartbeatQueue": "31000",
    "waitTimeMillsInPullQueue": "5000",
    "waitTimeMillsInSendQueue": "200",
    "waitTimeMillsInTransactionQueue": "3000",
    "warmMapedFileEnable": "false",
    "writeBufferHighWaterMark": "0",
    "writeBufferLowWaterMark": "0",
}


def derived(listen_port: int, store_root: str, broker_ip: str) -> dict[str, str]:
    cores = os.cpu_count() or 1
    send = min(cores, 4)
    out = {
        "brokerIP2": broker_ip,
        "haListenPort": str(listen_port + 1),  # BrokerStartup: listenPort + 1
        "storePathCommitLog": os.path.join(store_root, "commitlog"),
        "sendMessageThreadPoolNums": str(send),
        "putMessageFutureThreadPoolNums": str(min(cores, 4)),
        "pullMessageThreadPoolNums": str(16 + cores * 2),
        "processReplyMessageThreadPoolNums": str(16 + cores * 2),
        "queryMessageThreadPoolNums": str(8 + cores),
        "heartbeatThreadPoolNums": str(min(32, cores)),
        "endTransactionThreadPoolNums": str(max(8 + cores * 2, send * 4)),
        "clientCallbackExecutorThreads": str(cores),
    }
    home = os.environ.get("ROCKETMQ_HOME")
    if home is not None:  # RocketMQ leaves a null setting out
        out["rocketmqHome"] = home
    return out


# The nameserver's NamesrvConfig and NettyServerConfig as RocketMQ 4.9.7's reports them
# (GET_NAMESRV_CONFIG; ``mqadmin getNamesrvConfig``); listenPort and the two paths are
# the embedded nameserver's own.
NAMESRV_STATIC: dict[str, str] = {
    "productEnvName": "center",
    "clusterTest": "false",
    "orderMessageEnable": "false",
    "serverWorkerThreads": "8",
    "serverCallbackExecutorThreads": "0",
    "serverSelectorThreads": "3",
    "serverOnewaySemaphoreValue": "256",
    "serverAsyncSemaphoreValue": "64",
    "serverChannelMaxIdleTimeSeconds": "120",
    "serverSocketSndBufSize": "0",
    "serverSocketRcvBufSize": "0",
    "writeBufferHighWaterMark": "0",
    "writeBufferLowWaterMark": "0",
    "serverSocketBacklog": "1024",
    "serverPooledByteBufAllocatorEnable": "true",
    "useEpollNativeSelector": "false",
}


def namesrv_settings(listen_port: str, kv_path: str, config_path: str) -> dict[str, str]:
    out = {
        "listenPort": listen_port,
        "kvConfigPath": kv_path,
        "configStorePath": config_path,
        **NAMESRV_STATIC,
    }
    home = os.environ.get("ROCKETMQ_HOME")
    if home is not None:  # a null rocketmqHome is left out, as RocketMQ leaves it
        out["rocketmqHome"] = home
    return out
