"""What psycopg is asked to send, seen below Django's cursor wrappers."""

import psycopg


class SentStatements:
    """The statements psycopg sends while the block runs (the PostgreSQL store binds its parameters on the server,
    below Django's cursor wrappers, so Django's own query capture would not see them)."""

    def __enter__(self):
        self.sent, self._original = [], psycopg.Cursor.execute
        sent, original = self.sent, self._original

        def execute(cursor, query, *args, **kwargs):
            sent.append(str(query))
            return original(cursor, query, *args, **kwargs)

        psycopg.Cursor.execute = execute
        return self

    def __exit__(self, *exc):
        psycopg.Cursor.execute = self._original

    def work(self) -> list[str]:
        """Without the savepoints of the test's own transaction (a request has a transaction of its own)."""
        return [s for s in self.sent if not s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
