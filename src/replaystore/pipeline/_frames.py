"""pandas for the WebGym drop-in wrappers: imported lazily, rows as plain dicts.

pandas is the optional extra ``replaystore[pandas]``; only the modules that take
and return DataFrames as WebGym does (``rollout_sampler``,
``task_history_manager``) import it, and only when called.
"""

from __future__ import annotations

from typing import Any


def require_pandas() -> Any:
    """The ``pandas`` module.

    Raises:
        ImportError: pandas is not installed (one line naming the extra).
    """
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "this WebGym-compatible API takes pandas DataFrames: pip install 'replaystore[pandas]'"
        ) from None
    return pandas


def check_frame(tasks: Any, name: str = "tasks") -> Any:
    """``tasks`` if it is a DataFrame; the pandas module is returned alongside for convenience.

    Raises:
        TypeError: ``tasks`` is not a pandas DataFrame (names the type).
        ImportError: pandas is not installed.
    """
    pd = require_pandas()
    if not isinstance(tasks, pd.DataFrame):
        raise TypeError(
            f"{name} must be a pandas DataFrame (one row per task, WebGym's task file "
            f"columns), got {type(tasks).__name__}"
        )
    return pd


def frame_records(frame: Any) -> list[dict[str, Any]]:
    """The rows of ``frame`` as dicts of Python values; missing cells (NaN/NA) become None.

    Cost: O(rows x columns), one pass in pandas.
    """
    clean = frame.astype(object).where(frame.notna(), None)
    return clean.to_dict("records")
