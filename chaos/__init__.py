"""Chaos suite: exactly-once effects and per-key order under scripted, seeded faults."""
