#!/bin/bash
# Builds RocketMQ's 5.x Java client (apache/rocketmq-clients, tag java-5.0.8: java/client-apis
# and java/client, what the rocketmq-client-java-noshade artifact holds) with plain javac, for
# `make interop` (ROCKETMQ5_JAVA_CLIENT=$OUT): Maven Central cannot be reached here, so the
# dependencies come from a RocketMQ 5.3.3 build made by ../shared/realrmq5 ($RR5/lib) and the
# local Maven repository. Nothing it makes belongs in the repository.
# Output in $OUT: client.jar, lib/ (every runtime dependency, copied), classpath.txt (one line).
#
# Variables:
#   OUT        output folder (required; outside the repository)
#   RR5        RocketMQ 5.3.3 build (lib/, build-work/classes/logback-1.3.5.jar, build-work/compile-only/)
#   MIRROR     bare git dir of apache/rocketmq-clients     (the search tool's fetch)
#   FC_MIRROR  bare git dir of lukas-krecan/future-converter (fetch; not in ~/.m2)
#   M2_REPO    local Maven repository (OpenTelemetry 1.62.0)                 [~/.m2/repository]
set -euo pipefail
OUT=${OUT:?set OUT to a folder outside the repository}
RR5=${RR5:?set RR5 to a RocketMQ 5.3.3 build}
MIRROR=${MIRROR:?set MIRROR to the apache/rocketmq-clients mirror}
FC_MIRROR=${FC_MIRROR:?set FC_MIRROR to the lukas-krecan/future-converter mirror}
M2=${M2_REPO:-$HOME/.m2/repository}
# compile-only stubs of the OTLP exporter (the client builds one only when the server turns
# client metrics on, which neither RocketMQ 5.3.3 nor idemp does)
STUBS_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/stubs
TAG=java-5.0.8
VERSION=5.0.8          # rocketmq.metadata.properties (the tag's pom already says 5.0.9-SNAPSHOT)
FC_TAG=future-converter-1.2.0
OTEL=1.62.0            # one consistent OpenTelemetry api+sdk set from ~/.m2 (client written for 1.14.0)
W=$OUT/work
JOPTS="-nowarn -encoding UTF-8 -g -proc:none --release 8"   # as the pom: maven.compiler.release 8
jcp() { local IFS=:; echo "$*"; }

rm -rf "$W" "$OUT/lib" "$OUT/client.jar"
mkdir -p "$W/src" "$W/classes" "$W/co" "$OUT/lib"
L=$OUT/lib

# ------------------------------------------------------------------ runtime dependency jars
for j in grpc-api-1.41.3 grpc-context-1.41.3 grpc-core-1.41.3 grpc-netty-shaded-1.41.3 grpc-protobuf-1.41.3 \
         grpc-protobuf-lite-1.41.3 grpc-stub-1.41.3 perfmark-api-0.21.0 protobuf-3.21.12 protobuf-util-3.21.12 \
         gson-2.10.1 guava-32.0.1-jre failureaccess-1.0.1 commons-lang3-3.12.0 javax.annotation-api-1.3.2 \
         slf4j-api-2.0.16 zstd-jni-1.5.5-11 lz4-java-1.8.0 rocketmq-proto-2.0.4; do
  cp "$RR5/lib/$j.jar" "$L/"
done
# plain (unrelocated) logback 1.3.5, compiled from source by the RocketMQ 5.3.3 build before it shades it
# (that build drops logback-classic's META-INF/services/ch.qos.logback.classic.spi.Configurator; without it
# logback 1.3 ignores logback.xml and falls back to console DEBUG logging, so it is put back here)
mkdir -p "$W/logback/META-INF/services"
echo ch.qos.logback.classic.util.DefaultJoranConfigurator > "$W/logback/META-INF/services/ch.qos.logback.classic.spi.Configurator"
cp "$RR5/build-work/classes/logback-1.3.5.jar" "$L/logback-classic-core-1.3.5.jar"
jar uf "$L/logback-classic-core-1.3.5.jar" -C "$W/logback" META-INF/services/ch.qos.logback.classic.spi.Configurator
for a in api context common sdk sdk-common sdk-metrics sdk-trace sdk-logs; do
  cp "$M2/io/opentelemetry/opentelemetry-$a/$OTEL/opentelemetry-$a-$OTEL.jar" "$L/"
done
# compile-only annotations (jsr305 javax.annotation.concurrent/Nullable, errorprone)
cp "$RR5/build-work/compile-only/jsr305-3.0.2.jar" "$RR5/build-work/compile-only/error_prone_annotations-2.18.0.jar" "$W/co/"

# ------------------------------------------------------------------ future-converter-java8-guava 1.2.0 (from source)
git --git-dir="$FC_MIRROR" archive --prefix=fc/ "$FC_TAG" common/src/main java8-common/src/main guava-common/src/main \
  java8-guava/src/main | tar -x -C "$W/src"
mkdir -p "$W/classes/fc"
javac $JOPTS -cp "$L/guava-32.0.1-jre.jar:$L/failureaccess-1.0.1.jar" -d "$W/classes/fc" \
  $(find "$W/src/fc" -name '*.java')
jar cf "$L/future-converter-java8-guava-1.2.0.jar" -C "$W/classes/fc" .

# ------------------------------------------------------------------ compile-only stubs
mkdir -p "$W/classes/stubs"
javac $JOPTS -cp "$(jcp "$L"/*.jar)" -d "$W/classes/stubs" $(find "$STUBS_SRC" -name '*.java')

# ------------------------------------------------------------------ client-apis + client
git --git-dir="$MIRROR" archive "$TAG" java/client-apis/src/main java/client/src/main | tar -x -C "$W/src"
CS=$W/src/java
find "$CS/client-apis/src/main/java" "$CS/client/src/main/java" -name '*.java' > "$W/client.srcs"
mkdir -p "$W/classes/client"
javac $JOPTS -Xmaxerrs 300 -cp "$(jcp "$L"/*.jar "$W"/co/*.jar "$W/classes/stubs")" -d "$W/classes/client" @"$W/client.srcs"
for r in "$CS/client-apis/src/main/resources" "$CS/client/src/main/resources"; do
  [ -d "$r" ] && cp -r "$r"/. "$W/classes/client/"
done
# resources-filtered (maven filtering of ${project.version})
sed "s/\${project.version}/$VERSION/" "$CS/client/src/main/resources-filtered/rocketmq.metadata.properties" \
  > "$W/classes/client/rocketmq.metadata.properties"
jar cf "$OUT/client.jar" -C "$W/classes/client" .

# ------------------------------------------------------------------ classpath
echo "$(jcp "$OUT/client.jar" "$L"/*.jar)" > "$OUT/classpath.txt"
echo "built $OUT/client.jar ($(unzip -l "$OUT/client.jar" | tail -1 | awk '{print $2}') entries); $(ls "$L" | wc -l) jars in $L"
