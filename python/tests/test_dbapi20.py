"""PEP 249 conformance: the DB-API 2.0 compliance suite from PyPI
(``dbapi-compliance``, Stuart Bishop's dbapi20.py) run against blobhouse,
each test on a database of its own."""

import tempfile
import unittest

import dbapi20

import blobhouse


class BlobhouseDBAPI20(dbapi20.DatabaseAPI20Test, unittest.TestCase):
    driver = blobhouse
    connect_args = ()
    connect_kw_args: dict = {}
    lower_func = "lower"

    def setUp(self):
        self._dir = tempfile.TemporaryDirectory(prefix="blobhouse-dbapi20-")
        self.connect_args = (self._dir.name + "/db",)

    def tearDown(self):
        super().tearDown()
        self._dir.cleanup()

    def test_nextset(self):
        # One result set per statement: nextset() says there is no other.
        con = self._connect()
        try:
            cur = con.cursor()
            self.executeDDL1(cur)
            cur.execute("select name from %sbooze" % self.table_prefix)
            self.assertIsNone(cur.nextset())
        finally:
            con.close()

    def test_setoutputsize(self):
        # setoutputsize() is accepted and changes nothing: results are Arrow.
        con = self._connect()
        try:
            cur = con.cursor()
            cur.setoutputsize(5, 0)
            self._paraminsert(cur)
        finally:
            con.close()
