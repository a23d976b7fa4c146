"""The embedding stage: Nyström reconstruction (the paper's rows mode), the server-side steps that turn
landmarks or rows into a map, and the site-side placement of a site's own records (no-rows mode)."""
