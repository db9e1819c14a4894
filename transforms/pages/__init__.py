"""Pages: cut large PDFs into page ranges, render, size, read the text layer; the per-document page work that runs
under the time limits."""
