"""Oracle: prints the row count of a Parquet file as read by pyarrow."""
import sys

import pyarrow.parquet as pq

print(pq.read_metadata(sys.argv[1]).num_rows)
