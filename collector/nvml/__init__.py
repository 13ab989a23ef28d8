"""The NVML source: discovery, the scrape plan, calls under deadlines, Xid events, decoding."""
