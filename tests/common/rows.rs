//! What the tests read back from the ledger's tables as the superuser
//! (bypassing the roles and fencing the application goes through): counts,
//! an operation's status by tool, a lease's expiry. Reads only; a test
//! arranges states through the ledger or its own SQL.

use leasegate::ledger::RunId;
use sqlx::Postgres;
use sqlx::postgres::PgRow;

use super::TestDb;

/// A value a query binds to a parameter.
pub trait Param: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send {}
impl<T: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send> Param for T {}

/// A value a query selects as a single column.
pub trait Column: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin {}
impl<T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin> Column for T {}

/// A row a query selects, as a tuple of its columns.
pub trait Row: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin {}
impl<T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin> Row for T {}

/// Parameters `$1`, `$2`, … of a query, as a tuple.
pub trait Params {
    fn arguments(self) -> sqlx::postgres::PgArguments;
}

macro_rules! params_for_tuple {
    ($($name:ident),+) => {
        impl<$($name),+> Params for ($($name,)+)
        where
            $($name: Param,)+
        {
            #[allow(non_snake_case)]
            fn arguments(self) -> sqlx::postgres::PgArguments {
                use sqlx::Arguments as _;
                let ($($name,)+) = self;
                let mut arguments = sqlx::postgres::PgArguments::default();
                $(arguments.add($name).expect("encode a query parameter");)+
                arguments
            }
        }
    };
}

impl Params for () {
    fn arguments(self) -> sqlx::postgres::PgArguments {
        sqlx::postgres::PgArguments::default()
    }
}

params_for_tuple!(A);
params_for_tuple!(A, B);
params_for_tuple!(A, B, C);

impl TestDb {
    /// The one value `sql` selects, with `$1` bound to `param`.
    pub async fn scalar<T: Column>(&self, sql: &'static str, param: impl Param) -> T {
        self.scalar_with(sql, (param,)).await
    }

    /// Every value `sql` selects, with `$1` bound to `param`.
    pub async fn scalars<T: Column>(&self, sql: &'static str, param: impl Param) -> Vec<T> {
        self.scalars_with(sql, (param,)).await
    }

    /// The one row `sql` selects, with `$1` bound to `param`.
    pub async fn row<T: Row>(&self, sql: &'static str, param: impl Param) -> T {
        self.row_with(sql, (param,)).await
    }

    /// Every row `sql` selects, with `$1` bound to `param`.
    pub async fn rows<T: Row>(&self, sql: &'static str, param: impl Param) -> Vec<T> {
        self.rows_with(sql, (param,)).await
    }

    /// The one value `sql` selects with `params` bound to `$1`, `$2`, ….
    pub async fn scalar_with<T: Column>(&self, sql: &'static str, params: impl Params) -> T {
        self.row_with::<(T,)>(sql, params).await.0
    }

    /// Every value `sql` selects with `params` bound to `$1`, `$2`, ….
    pub async fn scalars_with<T: Column>(&self, sql: &'static str, params: impl Params) -> Vec<T> {
        let rows = self.rows_with::<(T,)>(sql, params).await;
        rows.into_iter().map(|(value,)| value).collect()
    }

    /// The one row `sql` selects with `params` bound to `$1`, `$2`, ….
    pub async fn row_with<T: Row>(&self, sql: &'static str, params: impl Params) -> T {
        sqlx::query_as_with(sql, params.arguments())
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Every row `sql` selects with `params` bound to `$1`, `$2`, ….
    pub async fn rows_with<T: Row>(&self, sql: &'static str, params: impl Params) -> Vec<T> {
        sqlx::query_as_with(sql, params.arguments())
            .fetch_all(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs `sql` with `params` bound to `$1`, `$2`, … as the superuser (to
    /// arrange a state the ledger's functions would not write).
    pub async fn execute_with(&self, sql: &'static str, params: impl Params) {
        sqlx::query_with(sql, params.arguments())
            .execute(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one value `sql` (without parameters) selects.
    pub async fn query_scalar<T: Column>(&self, sql: &'static str) -> T {
        self.scalar_with(sql, ()).await
    }

    /// Every value `sql` (without parameters) selects.
    pub async fn query_scalars<T: Column>(&self, sql: &'static str) -> Vec<T> {
        self.scalars_with(sql, ()).await
    }

    /// The one row `sql` (without parameters) selects.
    pub async fn query_row<T: Row>(&self, sql: &'static str) -> T {
        self.row_with(sql, ()).await
    }

    /// Every row `sql` (without parameters) selects.
    pub async fn query_rows<T: Row>(&self, sql: &'static str) -> Vec<T> {
        self.rows_with(sql, ()).await
    }

    /// Every row of `table` (a name the caller trusts, quoted where it
    /// needs to be) in its text form.
    pub async fn rows_as_text(&self, table: &str) -> Vec<String> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT t::text FROM {table} t"
        )))
        .fetch_all(&self.admin)
        .await
        .unwrap_or_else(|e| panic!("read {table}: {e}"))
    }

    /// How many rows `table` holds.
    pub async fn row_count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("count the rows of {table}: {e}"))
    }

    /// The status of the (first) operation that called `tool`, if there is one.
    pub async fn status_of_tool(&self, tool: &str) -> Option<String> {
        sqlx::query_scalar("SELECT status FROM tool_operations WHERE tool_name = $1")
            .bind(tool)
            .fetch_optional(&self.admin)
            .await
            .expect("read the operation's status")
    }

    /// Waits until the operation that called `tool` exists and has `status`.
    pub async fn wait_tool_status(&self, what: &str, tool: &str, status: &str) {
        super::wait_until(what, || async {
            (self.status_of_tool(tool).await.as_deref() == Some(status)).then_some(())
        })
        .await
    }

    /// When the run's lease expires, as the lease row says.
    pub async fn lease_expiry(&self, run_id: RunId) -> chrono::DateTime<chrono::Utc> {
        sqlx::query_scalar("SELECT expires_at FROM worker_leases WHERE run_id = $1")
            .bind(run_id.as_uuid())
            .fetch_one(&self.admin)
            .await
            .expect("read the lease's expiry")
    }
}
