"""The parts of ``replaystore demo``, one module per part of the library.

Each part module defines ``run(out: pathlib.Path, quick: bool) -> list[str]``:
it does real work with the library, writes its outputs under ``out`` and
returns the summary lines the CLI prints. ``replaystore demo`` runs them in
this order, each in ``<out>/<part>/``:

* ``transitions``: Double DQN with prioritized replay on CartPole-v1, a 1-step and
  a 3-step (``n_step=3``) run side by side;
* ``trajectories``: the web-agent RL loop in a real headless Chromium on the
  local website suite, from task sampling to a LLaMA-Factory dataset (skipped,
  with one line saying how to get a browser, when there is none);
* ``experience``: several processes writing one SQLite experience store while
  it is sampled;
* ``distributed`` (opt-in, ``--part distributed``, needs the ``ray`` extra):
  Ape-X style Double DQN with CartPole actors in Ray feeding a sharded
  prioritized buffer;
* ``loop`` (opt-in, ``--part loop``, needs the tool environments of
  ``.ci/install-loop-tools``): WebGym's loop closed for real: demonstrations,
  LLaMA-Factory training of a tiny model, vLLM serving it, the trained model
  rolling out in the browser;
* ``miniwob`` (opt-in, ``--part miniwob``, needs the tool environments and the
  ``miniwob`` extra): the same loop on MiniWoB++ tasks, measured on held-out seeds
  by the pages' own reward.
"""

from __future__ import annotations

__all__ = ["OPT_IN_PARTS", "PARTS"]

PARTS: tuple[str, ...] = ("transitions", "trajectories", "experience")
# Run only when named (``--part distributed``, ``--part loop``, ``--part miniwob``): they
# need an optional extra or the loop's tool environments, and they take minutes.
OPT_IN_PARTS: tuple[str, ...] = ("distributed", "loop", "miniwob")
