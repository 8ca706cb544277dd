"""Where node summaries go: the store engine, and delivery from the node spool."""
