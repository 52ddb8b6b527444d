"""Issue 16: a memory-mapped transition buffer reopened after a SIGKILL in the middle of adds
and flushes holds exactly what one of its completed flushes held."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from replaystore.transitions import ReplayBuffer

_ADD_AND_FLUSH_FOREVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from replaystore.transitions import ReplayBuffer

    buf = ReplayBuffer("cpu", "cpu", 50_000, path=sys.argv[1], seed=0)
    i = 0
    while i < 65 * 20 * 30:  # 39,000 rows: never wraps the 50,000-slot ring
        ids = np.arange(i, i + 64)
        buf.add_batch({"obs": np.stack([ids, 3 * ids], 1).astype(np.float32), "action": ids})
        buf.add({"obs": np.array([i + 64, 3 * (i + 64)], np.float32), "action": i + 64})
        i += 65
        if i % (65 * 20) == 0:
            buf.flush()
            print(i, flush=True)  # rows [0, i) are flushed
    sys.stdin.read()  # done: wait to be killed (the parent never writes)
    """
)


@pytest.mark.slow  # a child process that imports torch: ~10 s on a loaded machine
@pytest.mark.parametrize("kill_after", [3, 15])
def test_memmap_reopened_after_sigkill_mid_add_holds_a_flushed_prefix(tmp_path, kill_after):
    directory = tmp_path / "replay"
    proc = subprocess.Popen(
        [sys.executable, "-c", _ADD_AND_FLUSH_FOREVER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    # Kill right after the child reports its kill_after-th flush: it is then adding,
    # flushing, or (on a slow parent) done and waiting; no timing involved.
    seen = [int(proc.stdout.readline()) for _ in range(kill_after)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    reported = [*seen, *(int(line) for line in proc.stdout.read().split())]
    proc.stdout.close()
    assert proc.stdin is not None
    proc.stdin.close()
    with ReplayBuffer("cpu", "cpu", 50_000, path=directory) as buf:
        n = len(buf)
        # The kill may land inside a flush after its number was printed or before:
        # what reopens is the last completed flush or the one being written.
        assert n >= reported[-1] and n % 1300 == 0 and n <= reported[-1] + 1300
        assert buf.pointer == n % 50_000 or n == 50_000
        out = buf.sample_all(chronological=True)
        ids = np.arange(n)
        np.testing.assert_array_equal(out["action"].numpy(), ids)
        np.testing.assert_array_equal(out["obs"].numpy(), np.stack([ids, 3 * ids], 1))
        buf.add({"obs": np.array([0.0, 0.0], np.float32), "action": -1})  # writable again
        assert len(buf) == min(n + 1, 50_000)
