"""Intake: list the inputs, read them, sniff and count pages, accept or reject, dedup by content."""
