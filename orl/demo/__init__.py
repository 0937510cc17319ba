"""The `orl demo` content: scenarios, scorers, the scripted user, its rule judges and the report.

Self-contained (stdlib, numpy, matplotlib and `orl.schemas.errors` only), so the orchestration in `orl` can
import it anywhere. Reads and writes no topics; `report.write_report` writes files into a folder.
"""
