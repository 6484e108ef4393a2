"""The executor pods' command (services/kafka2spark/executor.py): the JVM command line
from what Spark's driver puts in an executor pod's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.kafka2spark.executor import BACKEND, ExecutorEnvError, command, main

ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@driver.data.svc:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "2",
    "SPARK_EXECUTOR_MEMORY": "1536m",
    "SPARK_APPLICATION_ID": "spark-abc",
    "SPARK_EXECUTOR_POD_IP": "10.1.2.3",
    "SPARK_EXECUTOR_POD_NAME": "wc-walcast-kafka2spark-exec-3",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_JAVA_OPT_10": "-Dlast=1",
    "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078",
    "SPARK_JAVA_OPT_2": "-Dmiddle=1",
    "SPARK_EXTRA_CLASSPATH": "/opt/walcast/jars/*",
}


def test_the_backend_gets_the_drivers_arguments_and_options_in_order() -> None:
    cmd = command(ENV, "/usr/bin/java", Path("/site/pyspark/jars"))
    assert cmd[0] == "/usr/bin/java"
    backend = cmd.index(BACKEND)
    jvm = cmd[:backend]
    # SPARK_JAVA_OPT_<n> by number, not by name (10 after 2)
    opts = [o for o in jvm if (o.startswith("-D") and "=1" in o) or "driver.port" in o]
    assert opts == ["-Dspark.driver.port=7078", "-Dmiddle=1", "-Dlast=1"]
    assert "-Xmx1536m" in jvm
    assert "-Xms1536m" in jvm
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in jvm
    assert jvm[jvm.index("-cp") + 1] == "/site/pyspark/jars/*:/opt/walcast/jars/*"
    args = dict(zip(cmd[backend + 1 :: 2], cmd[backend + 2 :: 2], strict=True))
    assert args == {
        "--driver-url": ENV["SPARK_DRIVER_URL"],
        "--executor-id": "3",
        "--cores": "2",
        "--app-id": "spark-abc",
        "--hostname": "10.1.2.3",
        "--resourceProfileId": "0",
        "--podName": "wc-walcast-kafka2spark-exec-3",
    }


def test_started_by_hand_it_says_what_it_is_for(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ExecutorEnvError, match=r"SPARK_DRIVER_URL.*executor pods"):
        command({}, "java", Path("/jars"))
    assert main(["something"]) == 2
    assert "unexpected arguments" in capsys.readouterr().err
