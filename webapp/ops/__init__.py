"""Operating Troupe: health checks, the worker fleet, storage, the demo data."""
