"""The payload fields that hold an encoded image unless an operator is told otherwise: the
member extensions of WebDataset-style shards and the generic ``image``. Shared by the image
operators and provenance, which names each image's source."""

IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp", "image")
#: The patch-grid fields ``image_tokens``, ``decode_image`` and ``decode_video`` write by
#: default: a record with a non-empty one holds images or videos.
GRID_FIELDS = ("image_grid_thw", "video_grid_thw")
