"""The ``objectcache`` command: the top of the house.

It imports the other packages (lazily, so ``objectcache storage-server --help``
loads neither the benchmark harness nor numpy nor aiobotocore) and nothing
imports it.
"""
