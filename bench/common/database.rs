//! The scratch databases a harness measures on: named on the admin URL's
//! server, created afresh (dropped first if there), dropped at the end.

use sqlx::migrate::MigrateDatabase as _;

/// `url` with its database name replaced by `database` (query kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let after_scheme = base.find("//").map_or(0, |at| at + 2);
    let server = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    format!("{server}/{database}{query}")
}

/// Creates the database of `url`, dropping it first (with `FORCE`) if it exists.
pub async fn recreate(url: &str) -> anyhow::Result<()> {
    drop(url).await?;
    sqlx::Postgres::create_database(url).await?;
    Ok(())
}

/// Drops the database of `url` (with `FORCE`) if it exists.
pub async fn drop(url: &str) -> anyhow::Result<()> {
    if sqlx::Postgres::database_exists(url).await? {
        sqlx::Postgres::force_drop_database(url).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_replaced() {
        assert_eq!(
            with_database("postgres://u@h:5432/postgres?sslmode=disable", "x"),
            "postgres://u@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
    }
}
