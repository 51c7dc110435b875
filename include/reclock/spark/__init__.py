"""Spark glue, the only product code that imports pyspark besides the steps' Spark work: sessions (local, cluster or
Spark Connect) with Delta and the jars of ``var/jars/`` (:mod:`~reclock.spark.session`, also the Spark Connect
server's command), offset ranges read in Spark (:mod:`~reclock.spark.source`: a kind's native reader, else the
``reclock`` Python data source), Kafka ranges read by Spark's own Kafka source (:mod:`~reclock.spark.kafka`), the
law every read obeys (:mod:`~reclock.spark.rows`), and how check reports spell offsets (:mod:`~reclock.spark.labels`).
Source adapters (:mod:`reclock.sources`) import none of it.
"""
