"""Safety: blocklists, image classifiers, prompt-injection and personal-data scans, and the gate."""
