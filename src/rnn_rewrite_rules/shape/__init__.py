"""Facts about shapes and constant values, proved from the graph alone."""
