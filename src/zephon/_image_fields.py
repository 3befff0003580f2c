"""The payload fields that hold an encoded image unless an operator is told otherwise: the
member extensions of WebDataset-style shards and the generic ``image``. Shared by the image
operators and provenance, which names each image's source."""

IMAGE_FIELDS = ("jpg", "jpeg", "png", "webp", "image")
