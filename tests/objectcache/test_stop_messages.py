"""Ctrl-C on ``objectcache serve`` says what the stop waits for (issue 23 item 5)."""

from __future__ import annotations

import signal

from support import ServerProcess, make_tenants, write_config


def test_ctrl_c_says_what_the_stop_waits_for(tmp_path):
    config = write_config(tmp_path / "c.toml", tmp_path / "data", make_tenants("t"),
                          extra=f'\n[storage_server]\nsocket = "{tmp_path / "ss.sock"}"\n')
    proc = ServerProcess(config).start()
    assert proc.stop(signal.SIGINT) == 0
    text = "".join(proc.output)
    assert "objectcache: stopping: the gateway finishes requests in flight (up to 30 s), then the storage server" in text, text
