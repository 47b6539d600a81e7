// Package privtest proves the GRANT scripts of templates.RenderGrants
// minimal and sufficient: on real PostgreSQL and MariaDB servers (package
// testdb), each outboxgen component runs as a role holding exactly the
// grants the script gives it, and then once per privilege with that single
// privilege left out, which must fail with a permission error.
//
// The package holds tests only.
package privtest
