"""The report, rendered from results.json alone: results (the schema, building and
loading results.json), doc (Markdown and HTML), fmt (how numbers are written), figures,
sections (the text), render (all of it, re-runnable without recomputing)."""
