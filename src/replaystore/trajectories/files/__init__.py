"""The trajectory file format behind :class:`~replaystore.trajectories.storage.TrajectoryStorage`.

One module per idea, lowest layer first (a module imports only those above it in this
list):

* :mod:`.naming`: iteration file names, listing, temporary names, screenshot paths;
* :mod:`.jsonfast`: JSON and text speed-ups and the compiled kernels;
* :mod:`.frames`: zstandard and CRC32 framing, codec numbers;
* :mod:`.prompts`: splitting a prompt into its messages and joining it back;
* :mod:`.lines`: formats 1-2 (one JSON line per step);
* :mod:`.v4`: format 4's table of texts shared per file (written, indexed, read);
* :mod:`.v3`: format 3's frames (format 4 frames name texts of :mod:`.v4`);
* :mod:`replaystore.formats.trajectory_header`: format constants, the header and its
  checks (:func:`~replaystore.formats.trajectory_header.read_header`; :mod:`.header`
  re-exports its names);
* :mod:`.load`: whole-file and per-trajectory reads;
* :mod:`.writer`: encoding and writing a file; :mod:`.merge`: merging and upgrading;
* :mod:`.reader`: the cached step reader of a file-backed buffer;
* :mod:`.index`: the buffer index built from headers.

Nothing is imported here: import the module you need.
"""

__all__: list[str] = []
