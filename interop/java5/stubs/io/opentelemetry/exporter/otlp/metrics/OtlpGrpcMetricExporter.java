/*
 * Compile-only stub of opentelemetry-exporter-otlp-metrics 1.14.0 (io.opentelemetry.exporter.otlp.metrics),
 * only the members rocketmq-client-java 5.0.8 (ClientMeterManager) uses. Not on the runtime classpath:
 * the client only builds an exporter when the proxy's Settings turn client metrics on.
 */
package io.opentelemetry.exporter.otlp.metrics;

public abstract class OtlpGrpcMetricExporter implements io.opentelemetry.sdk.metrics.export.MetricExporter {
    public static OtlpGrpcMetricExporterBuilder builder() {
        throw new UnsupportedOperationException("compile-only stub");
    }
}
