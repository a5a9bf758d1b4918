"""One coroutine per S3 operation: ``async def op(req: S3Request) -> web.StreamResponse``; the rows of
:data:`gateway.s3api.router.ROUTES` say which request selects each."""
