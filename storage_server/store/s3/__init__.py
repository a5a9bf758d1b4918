"""The ``s3`` backend: ObjectCache nodes in front of an upstream S3-compatible store, with a bounded local chunk cache."""
