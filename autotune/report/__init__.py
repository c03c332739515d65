"""Seeing and using results: reports, plots and exporters of the best layout."""
