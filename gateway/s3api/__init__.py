"""The S3 REST surface: addressing and routing, one handler per operation, XML."""
