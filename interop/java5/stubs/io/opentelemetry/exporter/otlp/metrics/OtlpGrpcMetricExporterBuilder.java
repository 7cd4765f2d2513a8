/* Compile-only stub, see OtlpGrpcMetricExporter.java. */
package io.opentelemetry.exporter.otlp.metrics;

public final class OtlpGrpcMetricExporterBuilder {
    public OtlpGrpcMetricExporterBuilder setChannel(io.grpc.ManagedChannel channel) { return this; }
    public OtlpGrpcMetricExporterBuilder setTimeout(java.time.Duration timeout) { return this; }
    public OtlpGrpcMetricExporter build() { throw new UnsupportedOperationException("compile-only stub"); }
}
