"""One Spark session per process, light enough for CI, with Spark's own logging quiet.

`get_session(master)` builds it once (later calls return the same session, whatever
master they name, as Spark itself allows only one active context per JVM) and
registers the audit's Python data sources. `stop_session()` ends it (tests and the CLI
call it so that no JVM outlives them).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

SHUFFLE_PARTITIONS_DEFAULT = 4
JVM_EXIT_WAIT_S = 30.0
LOG4J_FILE = Path(__file__).with_name("log4j2.properties")
JAVA_OPTIONS_ENV = (
    "MQMETA_SPARK_JAVA_OPTIONS"  # more options for the driver JVM, e.g. -XX:TieredStopAtLevel=1
)
_lock = threading.Lock()
_session: Any = None


def _quiet_log4j(spark: Any) -> None:
    """Spark's JVM logs at WARN by default; the audit prints its own progress."""
    spark.sparkContext.setLogLevel("ERROR")


def get_session(master: str | None = None, shuffle_partitions: int = SHUFFLE_PARTITIONS_DEFAULT) -> Any:
    global _session
    with _lock:
        if _session is not None:
            return _session
        # Workers run the same interpreter (and so see the same installed packages).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        # More options for the driver's JVM (in local mode, the only one): the tests and CI
        # give `-XX:TieredStopAtLevel=1`, whose quicker JIT makes small audits faster.
        java_options = os.environ.get(JAVA_OPTIONS_ENV, "").strip()
        java_options = f" {java_options}" if java_options else ""
        builder = (
            SparkSession.builder.appName("mqmeta-audit")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.sql.adaptive.enabled", "true")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config(
                "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J_FILE}{java_options}"
            )
            .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J_FILE}")
            .config("spark.python.worker.reuse", "true")
            .config("spark.driver.memory", os.environ.get("MQMETA_SPARK_DRIVER_MEMORY", "1g"))
        )
        if master:
            builder = builder.master(master)
        elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # under spark-submit its --master rules
            builder = builder.master(os.environ.get("MQMETA_SPARK_MASTER", "local[*]"))
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback" warning
        with warnings.catch_warnings():
            # pyspark 4.3 warns that pandas 3 is newer than it knows; the audit uses Arrow, not pandas.
            warnings.filterwarnings(
                "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
            )
            spark = builder.getOrCreate()
        _quiet_log4j(spark)
        from mqmeta.spark.messages import MessageSource
        from mqmeta.spark.sources import register_sources

        register_sources(spark)
        spark.dataSource.register(MessageSource)
        _session = spark
        return spark


def stop_session() -> None:
    """Stops the session and the JVM behind it (a stopped session's JVM would go on using
    memory and some CPU); the next get_session starts a new one."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
            _stop_gateway()


def _stop_gateway() -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    SparkContext._gateway = None
    SparkContext._jvm = None
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)  # set by pyspark's launch_gateway
    if proc is not None:
        if proc.stdin is not None:
            proc.stdin.close()  # the JVM exits when its stdin closes
        proc.terminate()
        proc.wait(JVM_EXIT_WAIT_S)
