"""NATS: the connection, the stream, the state bucket and its one writer."""
