//! `sqlx::migrate!` embeds the migration files, but a proc macro cannot tell cargo to
//! watch a folder: without this, editing only a `.sql` file would leave the old
//! migrations in the build.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
