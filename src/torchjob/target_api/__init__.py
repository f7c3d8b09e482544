"""What targets share: the helpers of every target module (common) and name checks (names).

Targets import this package and :mod:`torchjob.targets`, never each other."""
