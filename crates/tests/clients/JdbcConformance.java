// pgjdbc (org.postgresql:postgresql, what DBeaver, DataGrip, Metabase and
// every JVM program use) against `blobhouse serve`, on the driver's default
// settings. Run by the suite (`server_clients.rs`) as
//     java -cp postgresql.jar JdbcConformance.java PORT USER PASSWORD CASE...
// Each case asserts what PostgreSQL would answer and prints "ok CASE"; a
// failed case prints "FAILED CASE" and its stack trace, and the exit code
// is then 1.

import java.math.BigDecimal;
import java.sql.*;
import java.util.*;

public class JdbcConformance {
    static String url;
    static Properties props = new Properties();

    static Connection connect() throws SQLException {
        return DriverManager.getConnection(url, props);
    }

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    /** Connects with no option at all, as a tool does, and queries. */
    static void connectsWithDefaults() throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            try (ResultSet rs = s.executeQuery("SELECT 1 AS one, 'x' AS x")) {
                check(rs.next() && rs.getInt(1) == 1 && rs.getString("x").equals("x"), "SELECT 1");
            }
            check(c.getMetaData().getDatabaseProductVersion().startsWith("16"), "server version " + c.getMetaData().getDatabaseProductVersion());
            check(c.getCatalog() != null, "current_catalog");
        }
    }

    /** pgjdbc switches to a named server-side statement and binary results from the 5th execution. */
    static void preparedStatementsPastTheThreshold() throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE pt (id BIGINT NOT NULL, i INT, d DECIMAL(12,2), t TIMESTAMP, dt DATE, b BOOLEAN, f DOUBLE, name VARCHAR)");
            s.execute("INSERT INTO pt VALUES (1, 42, 12.50, TIMESTAMP '2024-02-29 12:34:56.789', DATE '2024-02-29', true, 0.1, 'it''s')");
            try (PreparedStatement p = c.prepareStatement("SELECT i + ? FROM pt WHERE id = ?")) {
                for (int n = 0; n < 10; n++) {
                    p.setInt(1, n);
                    p.setLong(2, 1);
                    try (ResultSet rs = p.executeQuery()) {
                        check(rs.next(), "a row on execution " + n);
                        check(rs.getInt(1) == 42 + n, "execution " + n + " answered " + rs.getInt(1));
                    }
                }
            }
            try (PreparedStatement p = c.prepareStatement("SELECT i, d, t, dt, b, f, name FROM pt WHERE id = ?")) {
                for (int n = 0; n < 8; n++) {
                    p.setLong(1, 1);
                    try (ResultSet rs = p.executeQuery()) {
                        check(rs.next(), "a row");
                        check(rs.getInt(1) == 42, "int " + n);
                        check(rs.getBigDecimal(2).compareTo(new BigDecimal("12.50")) == 0, "decimal " + rs.getBigDecimal(2) + " on execution " + n);
                        check(rs.getTimestamp(3).equals(Timestamp.valueOf("2024-02-29 12:34:56.789")), "timestamp " + rs.getTimestamp(3) + " on execution " + n);
                        check(rs.getDate(4).toString().equals("2024-02-29"), "date " + rs.getDate(4));
                        check(rs.getBoolean(5), "boolean");
                        check(rs.getDouble(6) == 0.1, "double " + rs.getDouble(6));
                        check(rs.getString(7).equals("it's"), "text " + rs.getString(7));
                        check(rs.getObject(2) instanceof BigDecimal, "getObject of a decimal is a BigDecimal");
                    }
                }
            }
            try (PreparedStatement p = c.prepareStatement("SELECT count(*) FROM pt WHERE d = ? AND name = ? AND t < ?")) {
                p.setBigDecimal(1, new BigDecimal("12.50"));
                p.setString(2, "it's");
                p.setTimestamp(3, Timestamp.valueOf("2030-01-01 00:00:00"));
                try (ResultSet rs = p.executeQuery()) {
                    check(rs.next() && rs.getLong(1) == 1, "typed parameters match the row");
                }
            }
            ResultSetMetaData m;
            try (ResultSet rs = s.executeQuery("SELECT d FROM pt")) {
                m = rs.getMetaData();
                check(m.getPrecision(1) == 12 && m.getScale(1) == 2, "DECIMAL(12,2) reported as (" + m.getPrecision(1) + "," + m.getScale(1) + ")");
            }
        }
    }

    /** The DatabaseMetaData calls DBeaver makes on connecting and on browsing a table. */
    static void databaseMetadata() throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE meta (id BIGINT NOT NULL, price DECIMAL(12,2), name VARCHAR)");
            DatabaseMetaData md = c.getMetaData();
            List<String> tables = new ArrayList<>();
            try (ResultSet rs = md.getTables(null, "public", "%", new String[] {"TABLE"})) {
                while (rs.next()) tables.add(rs.getString("TABLE_NAME"));
            }
            check(tables.contains("meta"), "getTables lists meta: " + tables);
            Map<String, String> columns = new LinkedHashMap<>();
            try (ResultSet rs = md.getColumns(null, "public", "meta", "%")) {
                while (rs.next()) columns.put(rs.getString("COLUMN_NAME"), rs.getString("TYPE_NAME") + "/" + rs.getInt("COLUMN_SIZE") + "/" + rs.getInt("DECIMAL_DIGITS") + "/" + rs.getString("IS_NULLABLE"));
            }
            check(columns.keySet().equals(new LinkedHashSet<>(List.of("id", "price", "name"))), "getColumns: " + columns);
            check(columns.get("price").equals("numeric/12/2/YES"), "DECIMAL(12,2) in getColumns: " + columns.get("price"));
            check(columns.get("id").endsWith("/NO"), "NOT NULL in getColumns: " + columns.get("id"));
            try (ResultSet rs = md.getPrimaryKeys(null, "public", "meta")) {
                check(!rs.next(), "no primary key");
            }
            try (ResultSet rs = md.getIndexInfo(null, "public", "meta", false, true)) {
                check(!rs.next(), "no index");
            }
            try (ResultSet rs = md.getImportedKeys(null, "public", "meta")) {
                check(!rs.next(), "no foreign key");
            }
            try (ResultSet rs = md.getExportedKeys(null, "public", "meta")) {
                check(!rs.next(), "no foreign key pointing here");
            }
            Set<String> types = new HashSet<>();
            try (ResultSet rs = md.getTypeInfo()) {
                while (rs.next()) types.add(rs.getString("TYPE_NAME"));
            }
            check(types.containsAll(List.of("int4", "int8", "numeric", "text", "varchar", "bool", "date", "timestamp")), "getTypeInfo: " + types);
            List<String> schemas = new ArrayList<>();
            try (ResultSet rs = md.getSchemas()) {
                while (rs.next()) schemas.add(rs.getString("TABLE_SCHEM"));
            }
            check(schemas.contains("public"), "getSchemas: " + schemas);
            try (ResultSet rs = md.getCatalogs()) {
                check(rs.next(), "getCatalogs has the database");
            }
            try (ResultSet rs = md.getTableTypes()) {
                check(rs.next(), "getTableTypes");
            }
            check(md.getMaxColumnsInIndex() == 32, "max index keys");
        }
    }

    /** setFetchSize with autocommit off reads a large result a portal at a time. */
    static void fetchSizeStreams() throws Exception {
        try (Connection c = connect()) {
            c.setAutoCommit(false);
            try (Statement s = c.createStatement()) {
                s.setFetchSize(1000);
                long rows = 0, sum = 0;
                try (ResultSet rs = s.executeQuery("SELECT value FROM range(200000)")) {
                    while (rs.next()) {
                        rows++;
                        sum += rs.getLong(1);
                    }
                }
                check(rows == 200000 && sum == 199999L * 200000L / 2, "rows " + rows + " sum " + sum);
            }
            c.commit();
        }
    }

    /** Batch inserts and transactions with PostgreSQL's SQLSTATEs. */
    static void batchesAndTransactions() throws Exception {
        try (Connection a = connect(); Connection b = connect(); Statement s = a.createStatement()) {
            s.execute("CREATE TABLE acc (id INT NOT NULL, bal BIGINT)");
            a.setAutoCommit(false);
            try (PreparedStatement p = a.prepareStatement("INSERT INTO acc VALUES (?, ?)")) {
                for (int i = 0; i < 100; i++) {
                    p.setInt(1, i);
                    p.setLong(2, 100);
                    p.addBatch();
                }
                int[] counts = p.executeBatch();
                check(counts.length == 100, "batch counts " + counts.length);
            }
            a.commit();
            b.setAutoCommit(false);
            try (Statement sb = b.createStatement()) {
                s.executeUpdate("UPDATE acc SET bal = bal - 1 WHERE id = 1");
                sb.executeUpdate("UPDATE acc SET bal = bal + 1 WHERE id = 1");
                a.commit();
                try {
                    b.commit();
                    throw new AssertionError("two writers of one row both committed");
                } catch (SQLException e) {
                    check("40001".equals(e.getSQLState()), "serialization failure SQLSTATE " + e.getSQLState() + ": " + e.getMessage());
                }
            }
            try (ResultSet rs = s.executeQuery("SELECT sum(bal), count(*) FROM acc")) {
                check(rs.next() && rs.getLong(1) == 9999 && rs.getLong(2) == 100, "balances after one transfer");
            }
            a.rollback();
        }
    }

    public static void main(String[] args) throws Exception {
        url = "jdbc:postgresql://127.0.0.1:" + args[0] + "/blobhouse";
        props.setProperty("user", args[1]);
        props.setProperty("password", args[2]);
        Map<String, Callable> cases = new LinkedHashMap<>();
        cases.put("connectsWithDefaults", JdbcConformance::connectsWithDefaults);
        cases.put("preparedStatementsPastTheThreshold", JdbcConformance::preparedStatementsPastTheThreshold);
        cases.put("databaseMetadata", JdbcConformance::databaseMetadata);
        cases.put("fetchSizeStreams", JdbcConformance::fetchSizeStreams);
        cases.put("batchesAndTransactions", JdbcConformance::batchesAndTransactions);
        List<String> names = args.length > 3 ? Arrays.asList(args).subList(3, args.length) : new ArrayList<>(cases.keySet());
        int failed = 0;
        for (String name : names) {
            try {
                cases.get(name).call();
                System.out.println("ok " + name);
            } catch (Throwable t) {
                failed++;
                System.out.println("FAILED " + name);
                t.printStackTrace(System.out);
            }
            System.out.flush();
        }
        System.exit(failed == 0 ? 0 : 1);
    }

    interface Callable {
        void call() throws Exception;
    }
}
