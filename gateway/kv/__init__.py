"""KV extension operations (kv-get, kv-lookup, kv-put, kv-register), beside the S3 operations."""
