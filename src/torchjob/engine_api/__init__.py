"""The engine interface (base), the registry that finds engines by name, and what engines share
(settings, reasons). Nothing here imports an engine: engines import this package."""
