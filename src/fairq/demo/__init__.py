"""Demo workloads for fairq (install with ``pip install 'fairq[demo]'``)."""
