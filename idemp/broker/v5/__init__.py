"""RocketMQ 5's gRPC protocol on idemp's broker (what RocketMQ 5's proxy serves)."""
