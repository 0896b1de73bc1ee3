"""The envelope's wire format (serialization: msgpack v1-v3, encode/decode, the
counter BlobStore) and the compiled decoder it wraps (_envelope)."""
