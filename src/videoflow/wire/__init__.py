"""The envelope's wire format (serialization: msgpack v1-v3, encode/decode), the
numpy extension messages carry arrays in (numpy_ext), messages on their own and the
counter BlobStore they are offloaded to (offload), and the compiled decoder
serialization wraps (_envelope)."""
