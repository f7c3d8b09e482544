"""The job description: load (``source``), parse into the typed model (``parse``, ``model``), apply
Volcano's defaults (``defaults``), validate (``validate``) and write back (``manifest``). Pure: no
engine, no I/O beyond reading the job's file."""
