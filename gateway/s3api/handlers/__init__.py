"""One coroutine per S3 operation: ``async def op(req: S3Request) -> web.StreamResponse``."""
