"""Compatibility name for :mod:`replaystore.images` (screenshots as URLs).

The image helpers live in :mod:`replaystore.images`, below both
:mod:`replaystore.trajectories` and :mod:`replaystore.pipeline`, so neither
package imports the other for them. Every public name is re-exported here
unchanged (the same objects), so ``from replaystore.pipeline.images import
image_to_data_url`` keeps working.
"""

from __future__ import annotations

from replaystore.images import (
    EXTENSIONS,
    data_url_to_file,
    decode_data_url,
    file_url_to_path,
    image_mime_type,
    image_part_url,
    image_to_data_url,
    image_to_file_url,
    messages_to_data_urls,
    messages_to_file_urls,
    read_image,
    sniff_mime_type,
)

__all__ = [
    "EXTENSIONS",
    "data_url_to_file",
    "decode_data_url",
    "file_url_to_path",
    "image_mime_type",
    "image_part_url",
    "image_to_data_url",
    "image_to_file_url",
    "messages_to_data_urls",
    "messages_to_file_urls",
    "read_image",
    "sniff_mime_type",
]
