"""kvsim.study: what-if studies (``kvsim study``) and tuning (``kvsim tune``).

A study is many runs of one base config varied along axes; a tune is an Optuna search
over config keys evaluated on held-out sessions. Both only build configs and read
summaries: they run points through kvsim's public run API on dask.distributed workers
and never touch the engine. Modules: spec (the files), points (axes -> resolved
configs), daskclient (the Dask cluster, started and closed), execute (running points on
it, writing point folders), table and plots (across points), study
and tune (the two commands' work), html_report and html_page (report.html, the page a
person opens).
"""
