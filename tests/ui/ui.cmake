# The studio (Qt widgets, offscreen): wizard, runs database, run dashboard with a streaming
# child process. Screenshots of every page land in ${CMAKE_BINARY_DIR}/screenshots.
if(TARGET tessera_ui)
  add_executable(event_replay tools/event_replay.cpp)
  tessera_warnings(event_replay)

  # What the studio's suites share (tests/ui/studio_fixture.h).
  add_library(studio_test_support STATIC ui/studio_fixture.cpp)
  target_link_libraries(studio_test_support PUBLIC tessera_ui Qt6::Test)
  target_include_directories(studio_test_support PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_definitions(studio_test_support PRIVATE
    TESSERA_PYTHON="${TESSERA_PYTHON}"
    TESSERA_SCREENSHOT_DIR="${CMAKE_BINARY_DIR}/screenshots"
    TESSERA_CLI_PATH="$<TARGET_FILE:tessera-cli>")
  tessera_warnings(studio_test_support)

  tessera_add_qt_test(NAME test_runs_db SOURCES ui/test_runs_db.cpp LIBS tessera_ui LABELS ui)
  tessera_add_qt_test(NAME test_studio SOURCES ui/test_studio.cpp LIBS studio_test_support LABELS ui)
  add_dependencies(test_studio event_replay)
  target_compile_definitions(test_studio PRIVATE
    TESSERA_EVENT_REPLAY="$<TARGET_FILE:event_replay>"
    TESSERA_PYTHON="${TESSERA_PYTHON}"
    TESSERA_SCREENSHOT_DIR="${CMAKE_BINARY_DIR}/screenshots"
    TESSERA_CLI_PATH="$<TARGET_FILE:tessera-cli>")
  add_dependencies(test_studio tessera-cli)
  set_tests_properties(test_studio PROPERTIES TIMEOUT 600)
  # The dashboard's event-loop bound again, alone (RUN_SERIAL): the GUI thread's CPU time between
  # two ticks is 46-86 ms here alone, and read 103 ms in CI beside another test on the 2 vCPUs.
  # Beside others (above) test_studio holds it to a looser bound that still catches a stall.
  add_test(NAME test_studio_event_loop
           COMMAND test_studio dashboard_streams_a_child_run_into_charts_and_the_database)
  get_test_property(test_studio ENVIRONMENT studio_environment)
  set_tests_properties(test_studio_event_loop PROPERTIES LABELS ui RUN_SERIAL TRUE TIMEOUT 120
    ENVIRONMENT "${studio_environment};TESSERA_STUDIO_ALONE=1")

  # The Hub pages against tests/pylib/hub_server.py (started by tests/ui/hub_fixture.py).
  tessera_add_qt_test(NAME test_hub_pages SOURCES ui/test_hub_pages.cpp LIBS studio_test_support LABELS ui)
  target_compile_definitions(test_hub_pages PRIVATE
    TESSERA_PYTHON="${TESSERA_PYTHON}"
    TESSERA_HUB_FIXTURE="${CMAKE_CURRENT_SOURCE_DIR}/ui/hub_fixture.py"
    TESSERA_SCREENSHOT_DIR="${CMAKE_BINARY_DIR}/screenshots"
    TESSERA_CLI_PATH="$<TARGET_FILE:tessera-cli>")
  add_dependencies(test_hub_pages tessera-cli)
  set_tests_properties(test_hub_pages PROPERTIES TIMEOUT 300)

  # The desktop conventions: menus and shortcuts, Open run, the user guide, About, the theme, the
  # export dialog's folder handling, the demo offer and empty states, and screenshots of every
  # page; test_desktop_scaled takes the screenshots again at 200%.
  tessera_add_qt_test(NAME test_desktop SOURCES ui/test_desktop.cpp LIBS studio_test_support LABELS ui)
  target_compile_definitions(test_desktop PRIVATE
    TESSERA_PYTHON="${TESSERA_PYTHON}"
    TESSERA_USER_GUIDE="${PROJECT_SOURCE_DIR}/docs/user-guide.md"
    TESSERA_PROJECT_VERSION="${PROJECT_VERSION}")
  add_dependencies(test_desktop tessera-cli)
  set_tests_properties(test_desktop PROPERTIES TIMEOUT 600)
  add_test(NAME test_desktop_scaled COMMAND test_desktop screenshots_of_every_page)
  set_tests_properties(test_desktop_scaled PROPERTIES LABELS ui TIMEOUT 300 ENVIRONMENT
    "QT_QPA_PLATFORM=offscreen;QT_SCALE_FACTOR=2;XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/test-cache;${TESSERA_TEST_OMP}")

  # "Try it" against real `tessera-cli generate` children (demo models edited with Python).
  tessera_add_qt_test(NAME test_try_it SOURCES ui/test_try_it.cpp LIBS studio_test_support LABELS ui)
  target_compile_definitions(test_try_it PRIVATE TESSERA_PYTHON="${TESSERA_PYTHON}")
  add_dependencies(test_try_it tessera-cli)
  set_tests_properties(test_try_it PROPERTIES TIMEOUT 600)

  # The wizard's checks before each step, and a real run of a dataset with bad rows skipped.
  tessera_add_qt_test(NAME test_wizard_checks SOURCES ui/test_wizard_checks.cpp LIBS studio_test_support LABELS ui)
  add_dependencies(test_wizard_checks tessera-cli)
  # The learned-positions case makes a tiny GPT-2 with transformers.
  target_compile_definitions(test_wizard_checks PRIVATE TESSERA_PYTHON="${TESSERA_PYTHON}")
  set_tests_properties(test_wizard_checks PROPERTIES TIMEOUT 300)

  # The wizard's Review step: the summary against `tessera-cli plan`, the run's name in the runs
  # database and the dashboard, the run folder's checks (read-only, full, not a folder).
  tessera_add_qt_test(NAME test_review_page SOURCES ui/test_review_page.cpp LIBS studio_test_support LABELS ui)
  add_dependencies(test_review_page tessera-cli)
  set_tests_properties(test_review_page PROPERTIES TIMEOUT 600)

  # Keyboard mnemonics: on every page of the main window (with the menu bar) and in the dialogs
  # the menus open, no two shown widgets or menus share an Alt+letter.
  tessera_add_qt_test(NAME test_mnemonics SOURCES ui/test_mnemonics.cpp LIBS studio_test_support LABELS ui)
  add_dependencies(test_mnemonics tessera-cli)
  set_tests_properties(test_mnemonics PROPERTIES TIMEOUT 120)

  # The Nodes page against a real `tessera-cli agent` on 127.0.0.1: discovery, pairing through
  # the code, pre-flight checks (a failure's reason and what to do), the link, Remove.
  tessera_add_qt_test(NAME test_nodes_page SOURCES ui/test_nodes_page.cpp LIBS studio_test_support LABELS ui)
  add_dependencies(test_nodes_page tessera-cli)
  set_tests_properties(test_nodes_page PROPERTIES TIMEOUT 180)

  # The run dashboard's per-rank figures from a real 2-rank ddp stream (launch --nproc 2), and
  # the wizard launching N processes.
  tessera_add_qt_test(NAME test_rank_dashboard SOURCES ui/test_rank_dashboard.cpp LIBS studio_test_support LABELS ui)
  add_dependencies(test_rank_dashboard event_replay tessera-cli)
  target_compile_definitions(test_rank_dashboard PRIVATE TESSERA_EVENT_REPLAY="$<TARGET_FILE:event_replay>")
  set_tests_properties(test_rank_dashboard PROPERTIES TIMEOUT 300)

  # The journey a person takes through the real window (wizard, run, stop, resume, export, chat,
  # compare) on the xcb platform under Xvfb, driven by X input from xdotool. The wrapper starts
  # and stops the X server, and exits 77 (skipped) when Xvfb or xdotool is missing.
  add_executable(test_journey ui/test_journey.cpp)
  target_link_libraries(test_journey PRIVATE studio_test_support)
  tessera_warnings(test_journey)
  if(TESSERA_WITH_TORCH)
    set_target_properties(test_journey PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")
  endif()
  add_dependencies(test_journey tessera-cli)
  add_test(NAME test_journey
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/ui/run_under_xvfb.sh $<TARGET_FILE:test_journey>)
  # RUN_SERIAL: beside a CPU-bound test the X input of its Ctrl+Q (pressed as its run starts)
  # did not reach the window within 5 s, once in a CI run and once in three runs beside two busy
  # loops (session 57); alone it passed every time. Session 58 found why: the release it waited
  # for is the answer's to the question the key opens, which X may deliver to no window of ours
  # once the question has closed; that key now waits for the question instead.
  set_tests_properties(test_journey PROPERTIES LABELS "ui;xvfb" TIMEOUT 300 SKIP_RETURN_CODE 77
    RUN_SERIAL TRUE
    ENVIRONMENT "XDG_CACHE_HOME=${CMAKE_BINARY_DIR}/test-cache;${TESSERA_TEST_OMP}")
endif()
