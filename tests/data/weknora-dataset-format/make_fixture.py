"""Write the five Parquet files of this folder (run it from anywhere; it overwrites them).

The schema is the one of WeKnora's evaluation datasets (Tencent/WeKnora ``dataset/samples/``),
column for column and type for type; the text is written for weknora-nb's tests.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent

QUERY = "常见的关系型数据库有哪些"
PASSAGES = [
    "PostgreSQL 是一个开源的对象关系型数据库，支持事务、外键和多种索引类型。",
    "MySQL 是使用最广的开源关系型数据库之一，常与 InnoDB 存储引擎一起使用。",
    "SQLite 是嵌入式关系型数据库，整个数据库保存在一个文件中，无需单独的服务进程。",
    "Oracle Database 是商业关系型数据库，常见于大型企业的核心业务系统。",
]
ANSWER = "常见的关系型数据库有 PostgreSQL、MySQL、SQLite 和 Oracle Database。"

TABLES = {
    "queries": pa.table({"id": pa.array(["1"], pa.string()), "text": pa.array([QUERY], pa.string())}),
    "corpus": pa.table({"id": pa.array([str(i) for i in range(1, 5)], pa.string()),
                        "text": pa.array(PASSAGES, pa.string())}),
    "qrels": pa.table({"qid": pa.array(["1"] * 4, pa.string()), "pid": pa.array(["2", "3", "1", "4"], pa.string()),
                       "score": pa.array([1, 1, 1, 1], pa.int64())}),
    "answers": pa.table({"id": pa.array([1], pa.int64()), "text": pa.array([ANSWER], pa.string())}),
    "qas": pa.table({"qid": pa.array(["1"], pa.string()), "aid": pa.array([1], pa.int64())}),
}

if __name__ == "__main__":
    for name, table in TABLES.items():
        pq.write_table(table, HERE / f"{name}.parquet")
