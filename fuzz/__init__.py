"""Fuzz harnesses for idemp's remoting codec and broker dispatch (``make fuzz``)."""
