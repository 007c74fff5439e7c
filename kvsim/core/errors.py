"""Errors raised by the core. ConfigError names the offending field and value."""


class CoreError(RuntimeError):
    """A caller broke the core's contract (e.g. grew a request that is not active)."""


class ConfigError(ValueError):
    """A configuration value is impossible. The message names the field and the value."""

    def __init__(self, field: str, value: object, expected: str):
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: got {value!r}; expected {expected}")
