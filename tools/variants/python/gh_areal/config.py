"""The config reader of this package is gatehouse_adapter.config (one for every adapter); this path
re-exports it."""

from gatehouse_adapter.config import COMMON_IGNORED, ConfigReader, field_error  # noqa: F401
